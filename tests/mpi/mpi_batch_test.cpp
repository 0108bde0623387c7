// Batched plans on the MPI backend under mpirun -np 8: batches of mixed tensors (shapes, dtypes,
// placements, uneven and empty shards), every rank's result compared with its block of the
// global view.
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/execute_batch.hpp>
#include <dtensor/verify.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "agreement.hpp"

namespace {

using namespace dtensor;

// A random tensor on `mesh` whose target has no Partial (so each rank can check its own block),
// its dim 0 `scale` times as long as drawn.
Redistribution random_tensor(std::mt19937& rng, const DeviceMesh& mesh, std::int64_t scale = 1) {
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  const int ndim = 1 + pick(2);
  Shape shape;
  for (int d = 0; d < ndim; ++d)
    shape.push_back(
        std::array<std::int64_t, 6>{1, 3, 7, 8, 16, 64}[static_cast<std::size_t>(pick(6))] *
        (d == 0 ? scale : 1));
  const DType dtypes[] = {DType::f32, DType::i64, DType::bf16, DType::i32};
  const DType dtype = dtypes[pick(4)];
  auto placements = [&](bool partial) {
    Placements ps;
    for (int k = 0; k < mesh.ndim(); ++k) {
      const int c = pick(partial ? 4 : 3);
      ps.push_back(c == 0   ? Placement::replicate()
                   : c == 3 ? Placement::partial(pick(2) == 0 ? ReduceOp::sum : ReduceOp::max)
                            : Placement::shard(pick(ndim)));
    }
    return ps;
  };
  return {Layout(mesh, placements(true), shape, dtype),
          Layout(mesh, placements(false), shape, dtype)};
}

// What differs between this rank's results and its blocks of the global view ("" if nothing).
std::string check(const BatchPlan<16>& batch, const std::vector<std::vector<std::byte>>& out,
                  int rank) {
  for (std::size_t t = 0; t < batch.size(); ++t) {
    const Layout& dst = batch[t].dst();
    std::string problem;
    detail::visit_dtype(dst.dtype(), [&]<class T>() {
      const std::vector<T> want = global_view_block<T>(dst, rank);
      const double tolerance = dst.dtype() == DType::bf16 ? 1e-2
                               : is_floating(dst.dtype()) ? 1e-6
                                                          : 0;
      const auto* got = reinterpret_cast<const T*>(out[t].data());
      for (std::size_t e = 0; e < want.size() && problem.empty(); ++e) {
        const double a = double(detail::widen(got[e])), b = double(detail::widen(want[e]));
        if (std::abs(a - b) > tolerance * std::max(1.0, std::abs(b)))
          problem = fmt::format("tensor {} ({} -> {}, {} {}) element {}: {} instead of {}", t,
                                batch[t].src().placements(), dst.placements(), dst.global_shape(),
                                dst.dtype(), e, a, b);
      }
    });
    if (!problem.empty()) return problem;
  }
  return "";
}

// This rank's source blocks of the global view and zeroed targets, one per tensor of `batch`,
// and the buffers execute() takes over them.
struct Blocks {
  std::vector<std::vector<std::byte>> in, out;
  std::vector<TensorBuffers> buffers;
};
Blocks blocks_of(const BatchPlan<16>& batch, int rank) {
  Blocks b;
  for (const Plan& p : batch) {
    detail::visit_dtype(p.src().dtype(), [&]<class T>() {
      const std::vector<T> block = global_view_block<T>(p.src(), rank);
      b.in.emplace_back(reinterpret_cast<const std::byte*>(block.data()),
                        reinterpret_cast<const std::byte*>(block.data() + block.size()));
    });
    b.out.emplace_back(static_cast<std::size_t>(p.dst().local_bytes(rank)));
  }
  for (std::size_t t = 0; t < batch.size(); ++t)
    b.buffers.push_back({b.in[t].data(), b.in[t].size(), b.out[t].data(), b.out[t].size()});
  return b;
}

// Runs `batch` over `buffers` (blocking, or with `async` started by execute_async, polled with
// test() and waited for) and says what differs between the results in `out` and this rank's
// blocks of the global view, or the error the run gave, or (blocking) that the scratch held
// passed workspace_bytes(batch, backend) ("" if none).
std::string run_and_check(const BatchPlan<16>& batch, MpiBackend& backend,
                          const std::vector<TensorBuffers>& buffers,
                          const std::vector<std::vector<std::byte>>& out, int rank,
                          bool async = false) {
  try {
    if (async) {
      Execution<MpiBackend> e =
          execute_async(batch, backend, std::span<const TensorBuffers>(buffers));
      for (int i = 0; i < 3 && !e.test(); ++i) {
      }
      e.wait();
    } else {
      ExecuteStats stats;
      execute(batch, backend, std::span<const TensorBuffers>(buffers), &stats);
      if (stats.scratch_peak_bytes > workspace_bytes(batch, backend))
        return fmt::format("rank {} held {} bytes of scratch, more than workspace_bytes' {}", rank,
                           stats.scratch_peak_bytes, workspace_bytes(batch, backend));
    }
    return check(batch, out, rank);
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  testing::Agreement verdicts(world_rank);
  std::mt19937 rng(7);  // the same batches on every rank
  for (const char* spelling : {"8", "2x4", "2x2x2"}) {
    const DeviceMesh mesh = parse_mesh(spelling);
    if (mesh.size() != world_size) continue;
    // The default backend, and one whose all-to-all and all-gather rounds run from the tensors'
    // buffers at any size, or never (MpiBackend::Options::batched_all_to_all_from_bytes,
    // batched_all_gather_from_bytes).
    MpiBackend backend(mesh);
    MpiBackend::Options always, never;
    always.batched_all_to_all_from_bytes = always.batched_all_gather_from_bytes = 0;
    never.batched_all_to_all_from_bytes = never.batched_all_gather_from_bytes =
        std::numeric_limits<std::size_t>::max();
    MpiBackend from_buffers(mesh, MPI_COMM_WORLD, always), packed(mesh, MPI_COMM_WORLD, never);
    std::vector<std::vector<Redistribution>> batches;
    for (int size : {1, 3, 16}) {
      batches.emplace_back();
      for (int t = 0; t < size; ++t) batches.back().push_back(random_tensor(rng, mesh));
    }
    // Large ones too (dim 0 up to 16 Ki), whose rounds run from the tensors' buffers
    // (MpiBackend::batched_all_to_all_bytes, batched_all_gather_bytes, reduce_messages_bytes).
    for (int b = 0; b < 2; ++b) {
      batches.emplace_back();
      for (int t = 0; t < 16; ++t) batches.back().push_back(random_tensor(rng, mesh, 256));
    }
    // All-to-alls of four tensors on the innermost mesh dim, row and column pieces: one round,
    // which MPI packs when it is small and runs from the tensors' own buffers (BatchedAllToAll,
    // MPI_Ialltoallw) when it is large (MpiBackend::batched_all_to_all_bytes).
    const int g = mesh.size(mesh.ndim() - 1);
    auto on_last = [&](const char* from, const char* to, const Shape& shape, DType dtype) {
      std::string a, b;
      for (int k = 0; k + 1 < mesh.ndim(); ++k) a += "R,", b += "R,";
      return Redistribution{Layout(mesh, parse_placements(a + from), shape, dtype),
                            Layout(mesh, parse_placements(b + to), shape, dtype)};
    };
    for (const std::int64_t rows : {1, 8192 / g})
      batches.push_back({on_last("S(0)", "S(1)", {2 * g * rows, 3 * g}, DType::f32),
                         on_last("S(1)", "S(0)", {g, 4 * g * rows}, DType::bf16),
                         on_last("S(0)", "S(2)", {g, 3, 2 * g * rows}, DType::i64),
                         on_last("S(0)", "S(1)", {8 * g * rows, g}, DType::i32)});
    // All-gathers of four tensors likewise (FSDP's parameters), row and column pieces: packed
    // when small, gathered where they go when large (BatchedAllGather, MPI_Ialltoallw from
    // MpiBackend::batched_all_gather_bytes).
    for (const std::int64_t rows : {1, 8192 / g})
      batches.push_back({on_last("S(0)", "R", {2 * g * rows, 3 * g}, DType::f32),
                         on_last("S(1)", "R", {g, 4 * g * rows}, DType::bf16),
                         on_last("S(2)", "R", {g, 3, 2 * g * rows}, DType::i64),
                         on_last("S(0)", "R", {8 * g * rows, g}, DType::i32)});
    static_assert(BatchedAllToAll<MpiBackend> && BatchedAllGather<MpiBackend>);
    // Under Memory::bounded the small all-to-all and all-gather rounds above run from the
    // tensors' buffers too, on the default backend (round_thresholds): no packing, so the scratch
    // stays within the packed larger side, where packed the all-to-all holds twice it.
    for (const std::size_t small : {batches.size() - 4, batches.size() - 2}) {
      const std::vector<Redistribution>& tensors = batches[small];
      const auto fast = std::make_unique<BatchPlan<16>>(plan_batch<16>(tensors));
      const auto bounded = std::make_unique<BatchPlan<16>>(
          plan_batch<16>(tensors, PlanOptions{.memory = Memory::bounded}));
      std::int64_t larger = 0;
      for (const Plan& p : *bounded)
        larger += std::max(p.src().local_bytes(world_rank), p.dst().local_bytes(world_rank));
      const Blocks b = blocks_of(*bounded, world_rank);
      std::string problem = run_and_check(*bounded, backend, b.buffers, b.out, world_rank);
      const std::int64_t held = workspace_bytes(*bounded, backend);
      if (problem.empty() && (held > larger || held >= workspace_bytes(*fast, backend)))
        problem = fmt::format("rank {}: {} bytes of scratch bounded, {} not, packed larger side {}",
                              world_rank, held, workspace_bytes(*fast, backend), larger);
      verdicts.agree(
          fmt::format("mesh {}, a small batch under Memory::bounded from the tensors' "
                      "buffers ({})",
                      spelling, small == batches.size() - 4 ? "all-to-all" : "all-gather"),
          problem.empty(), problem);
      if (small != batches.size() - 4) continue;
      // On a backend whose all-to-all rounds never run from the buffers (as NCCL's), the round
      // runs by peers (RoundThresholds::all_to_all_by_peers), g - 1 point-to-point rounds of one
      // member's pieces each way: within the packed larger side, blocking and started async.
      for (const bool async : {false, true}) {
        const Blocks by_peers = blocks_of(*bounded, world_rank);
        std::string why =
            run_and_check(*bounded, packed, by_peers.buffers, by_peers.out, world_rank, async);
        const std::int64_t peers_held = workspace_bytes(*bounded, packed);
        if (why.empty() && (peers_held > larger || peers_held >= workspace_bytes(*fast, packed)))
          why = fmt::format("rank {}: {} bytes of scratch by peers, {} packed, larger side {}",
                            world_rank, peers_held, workspace_bytes(*fast, packed), larger);
        verdicts.agree(fmt::format("mesh {}, a small all-to-all batch under Memory::bounded by "
                                   "peers{}",
                                   spelling, async ? ", execute_async" : ""),
                       why.empty(), why);
      }
    }
    for (const std::vector<Redistribution>& tensors : batches) {
      const int size = static_cast<int>(tensors.size());
      for (const BatchSchedule how : {BatchSchedule::fused, BatchSchedule::fewest_calls})
        for (const bool async : {false, true}) {
          const auto batch = std::make_unique<BatchPlan<16>>(plan_batch<16>(tensors, {}, how));
          const Blocks b = blocks_of(*batch, world_rank);
          const std::string problem =
              run_and_check(*batch, backend, b.buffers, b.out, world_rank, async);
          verdicts.agree(fmt::format("mesh {}, batch of {} ({} rounds, {}{})", spelling, size,
                                     batch->collectives(),
                                     how == BatchSchedule::fused ? "fused" : "fewest calls",
                                     async ? ", execute_async" : ""),
                         problem.empty(), problem);
        }
      const auto batch = std::make_unique<BatchPlan<16>>(plan_batch<16>(tensors));
      for (MpiBackend* other : {&from_buffers, &packed}) {
        const Blocks b = blocks_of(*batch, world_rank);
        const std::string problem = run_and_check(*batch, *other, b.buffers, b.out, world_rank);
        verdicts.agree(fmt::format("mesh {}, batch of {}, rounds {}", spelling, size,
                                   other == &packed ? "packed" : "from the tensors' buffers"),
                       problem.empty(), problem);
      }
    }
  }
  // A layer's parameters gathered in place (each shard at its rank's slab of its gathered
  // buffer), packed when small and from the tensors' buffers when large.
  for (const std::int64_t rows : {8, 4096}) {
    const DeviceMesh mesh({world_size});
    MpiBackend backend(mesh);
    std::vector<Redistribution> layer;
    for (int t = 0; t < 4; ++t) {
      const Shape shape{rows * world_size * (1 + t), 16};
      const DType dtype = t % 2 == 0 ? DType::f32 : DType::bf16;
      layer.push_back({Layout(mesh, parse_placements("S(0)"), shape, dtype),
                       Layout(mesh, parse_placements("R"), shape, dtype)});
    }
    const auto batch = std::make_unique<BatchPlan<16>>(plan_batch<16>(layer));
    std::vector<std::vector<std::byte>> whole;
    std::vector<TensorBuffers> buffers;
    for (const Plan& p : *batch) {
      const auto piece = static_cast<std::size_t>(p.src().local_bytes(world_rank));
      whole.emplace_back(static_cast<std::size_t>(p.dst().local_bytes(world_rank)));
      std::byte* slot = whole.back().data() + static_cast<std::size_t>(world_rank) * piece;
      detail::visit_dtype(p.src().dtype(), [&]<class T>() {
        const std::vector<T> mine = global_view_block<T>(p.src(), world_rank);
        std::memcpy(slot, mine.data(), piece);
      });
      buffers.push_back({slot, piece, whole.back().data(), whole.back().size()});
    }
    const std::string problem = run_and_check(*batch, backend, buffers, whole, world_rank);
    verdicts.agree(fmt::format("a layer of 4 tensors gathered in place, {} rows per rank", rows),
                   problem.empty(), problem);
  }
  // A layer's gradients reduce-scattered (1-D) or all-reduced (2-D, mesh dim 0) together, f32
  // and bf16 rounds: by the collective when small, and by messages when large (from 1 MiB of
  // packed block, MpiBackend::reduce_messages_bytes): from the tensors' buffers (each rank's
  // pieces sent where they lie by one batched all-to-all, the partials reduced into the targets,
  // an all-reduce's slices then gathered by one batched all-gather), or packed where a block of
  // an all-reduce does not cut into equal slices (odd columns).
  struct Grads {
    const char *mesh, *from, *to;
    std::int64_t rows, cols;
  };
  for (const Grads& c : {Grads{"8", "P", "S(0)", 8, 16}, Grads{"8", "P", "S(0)", 4096, 16},
                         Grads{"2x4", "P,R", "R,R", 8, 16}, Grads{"2x4", "P,R", "R,R", 4096, 16},
                         Grads{"2x4", "P,R", "R,R", 4095, 3}}) {
    const DeviceMesh mesh = parse_mesh(c.mesh);
    if (mesh.size() != world_size) continue;
    const std::int64_t rows = c.rows;
    MpiBackend backend(mesh);
    std::vector<Redistribution> grads;
    for (int t = 0; t < 4; ++t) {
      const Shape shape{rows * world_size * (1 + t % 2) + (c.cols % 2), c.cols + 8 * t};
      const DType dtype = t < 2 ? DType::f32 : DType::bf16;
      grads.push_back({Layout(mesh, parse_placements(c.from), shape, dtype),
                       Layout(mesh, parse_placements(c.to), shape, dtype)});
    }
    const auto batch = std::make_unique<BatchPlan<16>>(plan_batch<16>(grads));
    for (const bool async : {false, true}) {
      const Blocks b = blocks_of(*batch, world_rank);
      const std::string problem =
          run_and_check(*batch, backend, b.buffers, b.out, world_rank, async);
      verdicts.agree(
          fmt::format("a layer's gradients, {} -> {} on {}, {} rows per rank, {} columns{}", c.from,
                      c.to, c.mesh, rows, c.cols, async ? ", execute_async" : ""),
          problem.empty(), problem);
    }
  }
  // Batches among other executions in flight on one backend, as FSDP prefetches a layer: a plan
  // started, a batch started, another plan started, waited for in another order; and a blocking
  // batched execute() while an execution is still to start operations (it runs as
  // execute_async(...).wait(), after those before it). Every result against the global view.
  if (world_size % 2 == 0) {
    const DeviceMesh mesh({2, world_size / 2});
    MpiBackend backend(mesh);
    const Layout a(mesh, parse_placements("S(0),S(1)"), {8, 8}, DType::f32);
    const Layout b(mesh, parse_placements("R,R"), {8, 8}, DType::f32);
    const Plan two_gathers = plan_redistribute(a, b);
    const std::vector<float> in = global_view_block<float>(a, world_rank);
    const std::vector<float> want = global_view_block<float>(b, world_rank);
    std::vector<float> first(64), last(64), blocking_first(64);
    std::mt19937 same(11);
    std::vector<Redistribution> layer;
    for (int t = 0; t < 6; ++t) layer.push_back(random_tensor(same, mesh, t < 3 ? 1 : 512));
    const auto batch = std::make_unique<BatchPlan<16>>(plan_batch<16>(layer));
    const Blocks started = blocks_of(*batch, world_rank), blocking = blocks_of(*batch, world_rank);
    std::string problem;
    try {
      Execution<MpiBackend> p1 =
          execute_async(two_gathers, backend, std::span<const float>(in), std::span<float>(first));
      Execution<MpiBackend> bx =
          execute_async(*batch, backend, std::span<const TensorBuffers>(started.buffers));
      Execution<MpiBackend> p2 =
          execute_async(two_gathers, backend, std::span<const float>(in), std::span<float>(last));
      p2.wait();
      bx.test();
      p1.wait();
      bx.wait();
      problem = check(*batch, started.out, world_rank);
      if (problem.empty() && (first != want || last != want))
        problem = "a plan in flight beside the batch gave other values";
      Execution<MpiBackend> p3 = execute_async(two_gathers, backend, std::span<const float>(in),
                                               std::span<float>(blocking_first));
      execute(*batch, backend, std::span<const TensorBuffers>(blocking.buffers));
      if (problem.empty()) problem = check(*batch, blocking.out, world_rank);
      p3.wait();
      if (problem.empty() && blocking_first != want)
        problem = "the plan in flight before a blocking batch gave other values";
    } catch (const std::exception& e) {
      problem = e.what();
    }
    verdicts.agree("batches among executions in flight", problem.empty(), problem);
  }
  if (world_rank == 0)
    fmt::print("mpi_batch: {} passed, {} failed\n", verdicts.passed(), verdicts.failed());
  MPI_Finalize();
  return verdicts.failed() == 0 ? 0 : 1;
}
