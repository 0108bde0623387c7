// execute_async on the MPI backend under mpirun -np 8: many plans in flight on one backend and
// on two, finished by wait() in orders that differ from rank to rank, by test() polling, by a
// blocking execute() started behind them, and by destruction; every result equals the blocking
// execute() of the same plan (which mpi_execute checks against the global view) bit for bit.
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/verify.hpp>

#include <fmt/core.h>

#include "agreement.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace dtensor;

struct Case {
  const char* from;
  const char* to;
  Shape shape;
  DType dtype;
  Objective objective = Objective::time;
  Memory memory = Memory::any;
};

// One plan's buffers on this rank: its source block, the blocking run's result, and a target
// for the asynchronous run.
struct Job {
  Plan plan;
  std::vector<std::byte> src, expected, dst;
};

std::vector<std::byte> source_block(const Layout& l, int rank) {
  return detail::visit_dtype(l.dtype(), [&]<class T>() {
    const std::vector<T> block = global_view_block<T>(l, rank);
    std::vector<std::byte> bytes(block.size() * sizeof(T));
    if (!bytes.empty()) std::memcpy(bytes.data(), block.data(), bytes.size());
    return bytes;
  });
}

std::vector<Job> make_jobs(const DeviceMesh& mesh, MpiBackend& backend) {
  // One-step collectives, multi-step plans, exchanges, uneven and padded steps, reductions in
  // float for bf16 and avg: every kind of operation, several operations per plan (and per step).
  const Case cases[] = {
      {"S(0),R", "R,R", {64, 32}, DType::f32},
      {"R,P", "R,R", {16, 8}, DType::bf16},
      {"P,S(1)", "R,S(0)", {16, 8}, DType::f32},
      {"S(0),R", "R,S(0)", {16, 8}, DType::i64},
      {"S(0),S(0)", "R,S(0)", {13, 5}, DType::f32},
      {"P(avg),S(1)", "S(1),R", {8, 12}, DType::bf16},
      {"S(0),S(1)", "S(1),S(0)", {16, 16}, DType::f64},
      {"R,S(0)", "P(max),S(1)", {8, 8}, DType::i32},
      {"P,P", "S(0),S(1)", {10, 9}, DType::f32},
      {"S(1),R", "S(1),R", {4, 4}, DType::f32},
      // all-to-alls whose send pieces go strided (StridedAllToAll)
      {"R,S(0)", "R,S(1)", {8, 16}, DType::f32},
      {"S(0),R", "S(1),R", {16, 8}, DType::bf16},
      // all-gathers whose pieces land strided (StridedAllGather)
      {"R,S(1)", "R,R", {8, 16}, DType::f32},
      {"S(1),S(1)", "S(1),R", {8, 64}, DType::bf16},
      // exchanges from a Partial: two point-to-point rounds in one step
      {"P,S(0)", "S(0),S(1)", {8, 16}, DType::f32, Objective::bytes},
      {"P(max),S(1)", "R,S(0)", {7, 10}, DType::bf16, Objective::bytes},
      // reduce-scatters over 4 in 3 rounds (reduces_in_rounds): 3 operations
      {"S(0),P", "S(1),S(1)", {8, 16}, DType::f32, Objective::time, Memory::bounded},
      {"R,P(max)", "R,S(1)", {8, 16}, DType::bf16, Objective::time, Memory::bounded},
      // uneven pieces of a max, and of an i64 sum, over 4 in 3 rounds, each reduced after it
      {"P(sum),P(max)", "R,S(1)", {7, 10}, DType::f32, Objective::time, Memory::bounded},
      {"P(max),P(sum)", "R,S(1)", {7, 10}, DType::i64, Objective::time, Memory::bounded},
      // an exchange from a Partial whose parts reduce in one round per member (4), then delivered
      {"S(1),P", "R,S(1)", {7, 10}, DType::f32, Objective::bytes, Memory::bounded}};
  std::vector<Job> jobs;
  const int rank = backend.rank();
  for (const Case& c : cases) {
    const Layout src(mesh, parse_placements(c.from), c.shape, c.dtype);
    const Layout dst(mesh, parse_placements(c.to), c.shape, c.dtype);
    Job j{plan_redistribute(src, dst, {.objective = c.objective, .memory = c.memory}),
          source_block(src, rank),
          {},
          {}};
    const auto out = static_cast<std::size_t>(dst.local_numel(rank) * dst.elem_bytes());
    j.expected.resize(out);
    j.dst.assign(out, std::byte{0xAB});
    execute(j.plan, backend, j.src.data(), j.src.size(), j.expected.data(), j.expected.size());
    jobs.push_back(std::move(j));
  }
  return jobs;
}

class Checker : public testing::Agreement {
 public:
  using Agreement::Agreement;
  // The async results equal the blocking ones; the targets are reset for the next round.
  void results(const std::string& name, std::vector<Job>& jobs) {
    std::string why;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].dst != jobs[i].expected && why.empty())
        why = fmt::format("plan {} differs from the blocking run", i);
      std::fill(jobs[i].dst.begin(), jobs[i].dst.end(), std::byte{0xAB});
    }
    agree(name, why.empty(), why);
  }
};

Execution<MpiBackend> start(Job& j, MpiBackend& backend) {
  return execute_async(j.plan, backend, j.src.data(), j.src.size(), j.dst.data(), j.dst.size());
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Checker check(rank);
  // The strided all-to-alls and all-gathers by single copy (MpiBackend::SingleCopy::always, from
  // any size, rows straight) in flight together with the rest: each single copy sends its
  // members its word under a tag of its own, so copies may reach that stage in any order on any
  // rank. Waited in an order of each rank's own, then newest first.
  {
    const DeviceMesh mesh({2, size / 2});
    MpiBackend backend(mesh, MPI_COMM_WORLD,
                       {.timeout = std::chrono::seconds(60),
                        .single_copy = MpiBackend::SingleCopy::always,
                        .single_copy_from_bytes = 0,
                        .single_copy_direct_write_from_bytes = 0,
                        .single_copy_direct_read_from_bytes = 0});
    std::vector<Job> jobs = make_jobs(mesh, backend);
    for (int round = 0; round < 4; ++round) {
      std::vector<Execution<MpiBackend>> running;
      for (Job& j : jobs) running.push_back(start(j, backend));
      std::vector<std::size_t> order(jobs.size());
      std::iota(order.begin(), order.end(), 0);
      if (round < 3) {
        std::mt19937 rng(static_cast<unsigned>(rank * 7919 + round));
        std::shuffle(order.begin(), order.end(), rng);
      } else {
        std::reverse(order.begin(), order.end());
      }
      for (std::size_t i : order) running[i].wait();
      check.results(
          fmt::format("single copy in flight{}, round {}",
                      backend.single_copy(1) ? "" : " (not reachable here: datatypes)", round),
          jobs);
    }
    // A blocking execute beside a single copy in flight, in another order on half the ranks:
    // even ranks run it before waiting for the execution, odd ranks after. The blocking wait
    // advances the execution meanwhile, whose words the odd ranks wait for.
    std::vector<Job> two{jobs[10], jobs[12]};  // a strided all-to-all and a strided all-gather
    {
      Execution<MpiBackend> e = start(two[0], backend);
      Job& b = two[1];
      if (rank % 2 == 0) {
        execute(b.plan, backend, b.src.data(), b.src.size(), b.dst.data(), b.dst.size());
        e.wait();
      } else {
        e.wait();
        execute(b.plan, backend, b.src.data(), b.src.size(), b.dst.data(), b.dst.size());
      }
    }
    check.results("a blocking execute beside a single copy in flight", two);
  }
  {
    const DeviceMesh mesh({2, size / 2});
    MpiBackend backend(mesh);
    std::vector<Job> jobs = make_jobs(mesh, backend);
    const std::size_t n = jobs.size();

    // All in flight on one backend, waited in an order of each rank's own (a shuffle seeded by
    // the rank): the queue starts their operations in the same order everywhere.
    for (int round = 0; round < 3; ++round) {
      std::vector<Execution<MpiBackend>> running;
      for (Job& j : jobs) running.push_back(start(j, backend));
      std::vector<std::size_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::mt19937 rng(static_cast<unsigned>(rank * 7919 + round));
      std::shuffle(order.begin(), order.end(), rng);
      for (std::size_t i : order) running[i].wait();
      check.results(fmt::format("wait in a shuffled order, round {}", round), jobs);
    }

    // Newest first, and each twice (the second wait returns at once).
    {
      std::vector<Execution<MpiBackend>> running;
      for (Job& j : jobs) running.push_back(start(j, backend));
      for (std::size_t i = n; i-- > 0;) running[i].wait();
      for (auto& e : running) e.wait();
      check.results("wait newest first", jobs);
    }

    // test() until every one says done, in a rank-dependent rotation.
    {
      std::vector<Execution<MpiBackend>> running;
      for (Job& j : jobs) running.push_back(start(j, backend));
      std::vector<bool> done(n, false);
      for (std::size_t finished = 0, i = static_cast<std::size_t>(rank); finished < n; ++i) {
        const std::size_t k = i % n;
        if (!done[k] && running[k].test()) done[k] = true, ++finished;
      }
      for (auto& e : running) e.wait();  // rethrows errors, if any
      check.results("test() until done", jobs);
    }

    // Two backends on the same ranks: two independent queues, interleaved, waited crosswise.
    {
      MpiBackend second(mesh);
      std::vector<Execution<MpiBackend>> a, b;
      for (std::size_t i = 0; i < n; ++i)
        (i % 2 ? b : a).push_back(start(jobs[i], i % 2 ? second : backend));
      if (rank % 2) std::swap(a, b);
      for (auto& e : b) e.wait();
      for (auto& e : a) e.wait();
      check.results("two backends", jobs);
    }

    // A blocking execute() behind executions in flight runs after them, and they still finish.
    {
      std::vector<Execution<MpiBackend>> running;
      for (std::size_t i = 1; i < n; ++i) running.push_back(start(jobs[i], backend));
      ExecuteStats stats;
      execute(jobs[0].plan, backend, jobs[0].src.data(), jobs[0].src.size(), jobs[0].dst.data(),
              jobs[0].dst.size(), &stats);
      for (std::size_t i = running.size(); i-- > 0;) running[i].wait();
      check.results("blocking execute behind executions in flight", jobs);
      check.agree("scratch reported", stats.scratch_peak_bytes <= workspace_bytes(jobs[0].plan));
    }

    // Dropped without wait(): destruction waits, so the results are there afterwards.
    {
      std::vector<Execution<MpiBackend>> running;
      for (Job& j : jobs) running.push_back(start(j, backend));
      running.clear();
      check.agree("nothing left in flight", backend.executions().empty());
      check.results("destroyed without wait", jobs);
    }

    // The source is never written.
    {
      std::vector<std::vector<std::byte>> before;
      for (const Job& j : jobs) before.push_back(j.src);
      std::vector<Execution<MpiBackend>> running;
      for (Job& j : jobs) running.push_back(start(j, backend));
      for (auto& e : running) e.wait();
      bool same = true;
      for (std::size_t i = 0; i < n; ++i) same = same && before[i] == jobs[i].src;
      check.agree("sources untouched", same);
      check.results("sources untouched (results)", jobs);
    }

    // Bad arguments are refused when the execution starts, before anything is in flight.
    {
      Job& j = jobs[2];
      std::string message;
      try {
        auto e = execute_async(j.plan, backend, j.src.data(), j.src.size(), j.dst.data(),
                               j.dst.size() > 0 ? j.dst.size() - 1 : 0);
      } catch (const error& e) {
        message = e.what();
      }
      const bool expected = j.dst.empty()
                                ? message.empty()
                                : message.find("target buffer holds") != std::string::npos;
      check.agree("a target too small is refused", expected, message);
      check.agree("and leaves nothing in flight", backend.executions().empty());
    }
  }
  if (rank == 0) fmt::print("mpi_async: {} passed, {} failed\n", check.passed(), check.failed());
  MPI_Finalize();
  return check.failed() == 0 ? 0 : 1;
}
