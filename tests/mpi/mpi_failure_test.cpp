// Failures under mpirun -np 8: an error on one rank becomes an error on every rank (the backend
// aborts, nobody hangs), a rank that never comes is a timeout, and a failed run leaves every
// rank's source buffer as it was. Each case uses a fresh backend: an aborted one stays aborted.
// The buffers of failed runs stay allocated until after MPI_Finalize, as MpiBackend::abort()
// asks: MPI cannot cancel the collectives the other ranks had started.
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/verify.hpp>

#include <fmt/core.h>

#include "../forwarding_backend.hpp"
#include "agreement.hpp"

#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <vector>

namespace {

using namespace dtensor;
using namespace std::chrono_literals;

// Counts this rank's operations and throws at the n-th (counting from 1), or never (-1).
struct FailAt {
  int at = -1;
  int count = 0;
  void operator()() {
    if (++count == at) throw error("injected failure");
  }
};

// MpiBackend with one rank made to fail at its n-th operation: an error in the middle of a
// plan, after other ranks have started its collectives.
class FailingBackend : public testing::ForwardingBackend<MpiBackend, FailAt> {
 public:
  using Request = MpiBackend::Request;

  FailingBackend(MpiBackend& inner, int failing_rank, int fail_at)
      : ForwardingBackend(inner, FailAt{inner.rank() == failing_rank ? fail_at : -1}) {}

  void abort(std::string_view why) noexcept { inner_.abort(why); }
  // MpiBackend's staging, which outlives an abort.
  [[nodiscard]] auto local_ops() const { return inner_.local_ops(); }
};

struct Outcome {
  bool threw = false;
  std::string message;
  double seconds = 0;
};

Outcome attempt(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  Outcome o;
  try {
    f();
  } catch (const error& e) {
    o.threw = true;
    o.message = e.what();
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

using Checker = testing::Agreement;

bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  std::deque<std::vector<float>> buffers;  // outlives MPI_Finalize
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Checker check(rank);
  const DeviceMesh mesh({2, size / 2});
  // A two-step plan (reduce on dp, then all-to-all or exchange): failures before, between and
  // inside its collectives.
  const Layout from(mesh, parse_placements("P,S(1)"), {16, 8}, DType::f32);
  const Layout to(mesh, parse_placements("R,S(0)"), {16, 8}, DType::f32);
  const Plan plan = plan_redistribute(from, to);
  const std::vector<float> original = global_view_block<float>(from, rank);
  std::vector<float>& dst = buffers.emplace_back(static_cast<std::size_t>(to.local_numel(rank)));
  const MpiBackend::Options quick{2000ms};

  // 1. Rank 3 passes a target one element short: it throws at once, the others from the
  //    collective rank 3 never joins, naming rank 3.
  {
    MpiBackend backend(mesh, MPI_COMM_WORLD, quick);
    std::vector<float>& src = buffers.emplace_back(original);
    const std::size_t dst_bytes = (dst.size() - (rank == 3 ? 1 : 0)) * sizeof(float);
    const Outcome o =
        attempt([&] { execute(plan, backend, src.data(), src.size() * 4, dst.data(), dst_bytes); });
    const bool named = rank == 3 ? contains(o.message, "target buffer holds")
                                 : contains(o.message, "rank 3 failed");
    check.agree("one rank's bad argument is an error on all", o.threw && named, o.message);
    check.agree("before the timeout", o.seconds < 1.5, fmt::format("{:.2f} s", o.seconds));
    check.agree("the source unchanged", src == original, "source written");
    check.agree("the backend stays aborted",
                attempt([&] {
                  execute(plan, backend, src.data(), src.size() * 4, dst.data(), dst.size() * 4);
                }).threw,
                "a call on an aborted backend returned");
  }

  // 2. Rank 5 fails inside the plan, at its second collective: everyone else is inside or past
  //    the first.
  for (int fail_at : {1, 2}) {
    MpiBackend inner(mesh, MPI_COMM_WORLD, quick);
    FailingBackend backend(inner, 5, fail_at);
    std::vector<float>& src = buffers.emplace_back(original);
    const Outcome o = attempt(
        [&] { execute(plan, backend, src.data(), src.size() * 4, dst.data(), dst.size() * 4); });
    const bool named = rank == 5 ? contains(o.message, "injected failure")
                                 : contains(o.message, "rank 5 failed: injected failure");
    // At the second collective (the all-to-all on mesh dim 1) only rank 5's row waits for it:
    // the other row may finish first, and then the abort reaches it at its next call.
    const bool may_finish = fail_at == 2 && mesh.coordinate(rank)[0] != mesh.coordinate(5)[0];
    check.agree(fmt::format("a failure at collective {} reaches every rank", fail_at),
                o.threw ? named : may_finish, o.message);
    const bool next_call_throws =
        o.threw || attempt([&] {
                     execute(plan, backend, src.data(), src.size() * 4, dst.data(), dst.size() * 4);
                   }).threw;
    check.agree("the abort reaches a rank that finished at its next call", next_call_throws,
                "a call on the aborted backend returned");
    check.agree("the source unchanged", src == original, "source written");
  }

  // 3. Rank 6 never comes: the others time out (and abort), and rank 6 learns it on its next
  //    call.
  {
    MpiBackend backend(mesh, MPI_COMM_WORLD, MpiBackend::Options{300ms});
    std::vector<float>& src = buffers.emplace_back(original);
    Outcome o;
    if (rank != 6)
      o = attempt(
          [&] { execute(plan, backend, src.data(), src.size() * 4, dst.data(), dst.size() * 4); });
    MPI_Barrier(MPI_COMM_WORLD);  // rank 6 arrives late, after everyone has given up
    if (rank == 6)
      o = attempt(
          [&] { execute(plan, backend, src.data(), src.size() * 4, dst.data(), dst.size() * 4); });
    const bool named = contains(o.message, "did not complete within 300 ms") ||
                       contains(o.message, "MpiBackend aborted");
    check.agree("a rank that never comes is a timeout", o.threw && named, o.message);
    check.agree("the source unchanged", src == original, "source written");
  }

  // 4. Asynchronous: rank 2 refuses to start, the others' wait() throws.
  {
    MpiBackend backend(mesh, MPI_COMM_WORLD, quick);
    std::vector<float>& src = buffers.emplace_back(original);
    const Outcome o = attempt([&] {
      auto e = execute_async(plan, backend, src.data(), src.size() * 4, dst.data(),
                             rank == 2 ? 0 : dst.size() * 4);
      e.wait();
    });
    const bool named = rank == 2 ? contains(o.message, "target buffer holds")
                                 : contains(o.message, "rank 2 failed");
    check.agree("an async failure on one rank reaches every rank", o.threw && named, o.message);
    check.agree("nothing left in flight", backend.executions().empty(), "executions in flight");
  }

  // 5. The same with an all-to-all whose pieces MPI reads strided from the source (a derived
  //    datatype, StridedAllToAll): rank 6 never comes, the others time out, the sources stay.
  {
    const DeviceMesh line({size});  // one group: every rank waits for rank 6
    const Layout rows(line, parse_placements("S(0)"), {16, 32}, DType::f32);
    const Layout cols(line, parse_placements("S(1)"), {16, 32}, DType::f32);
    const Plan strided = plan_redistribute(rows, cols);
    MpiBackend backend(line, MPI_COMM_WORLD, MpiBackend::Options{300ms});
    std::vector<float>& src = buffers.emplace_back(global_view_block<float>(rows, rank));
    const std::vector<float> given = src;
    std::vector<float>& out =
        buffers.emplace_back(static_cast<std::size_t>(cols.local_numel(rank)));
    auto run = [&] {
      execute(strided, backend, src.data(), src.size() * 4, out.data(), out.size() * 4);
    };
    Outcome o;
    if (rank != 6) o = attempt(run);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 6) o = attempt(run);
    const bool named = contains(o.message, "did not complete within 300 ms") ||
                       contains(o.message, "MpiBackend aborted");
    check.agree("a strided all-to-all times out", o.threw && named, o.message);
    check.agree("the strided source unchanged", src == given, "source written");
  }

  // 6. And a fresh backend afterwards works.
  {
    MpiBackend backend(mesh);
    std::vector<float>& src = buffers.emplace_back(original);
    const Outcome o = attempt(
        [&] { execute(plan, backend, src.data(), src.size() * 4, dst.data(), dst.size() * 4); });
    check.agree("a new backend after the failures works", !o.threw, o.message);
  }

  if (rank == 0) fmt::print("mpi_failure: {} passed, {} failed\n", check.passed(), check.failed());
  MPI_Finalize();
  return check.failed() == 0 ? 0 : 1;
}
