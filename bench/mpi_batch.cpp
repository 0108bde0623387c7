// Many small tensors over MPI: one batched execute() against one execute() per tensor (issue
// 10's target: the batch at least 5x faster). Run: mpirun -np 8 build/release/bench/bench_mpi_batch
// [runs] [pattern] [batched KiB] [bounded] (only the patterns whose name starts with that, e.g.
// all-reduce; [batched KiB]: MpiBackend::Options::batched_all_to_all_from_bytes and
// batched_all_gather_from_bytes, -1 for never: such rounds packed; `bounded`: the batches
// planned under Memory::bounded, whose all-to-all rounds then run by peers where they would pack)
//
// The batch: 64 tensors of 4 KiB to 256 KiB per rank (the larger side; and a second sweep of
// 256 B to 16 KiB, where latency dominates), f32 and bf16, as a
// training step moves them: FSDP's all-gather of a layer's parameters (S(0) -> R), the
// gradients' reduce-scatter (P -> S(0)), their all-reduce (P -> R) on 2 x 4, sequence
// parallelism's all-to-all (S(0) -> S(1)), and a mix of all three with resharding. The last
// column is workspace_bytes(batch, backend) over the packed size of the larger side.
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/execute_batch.hpp>

#include <fmt/core.h>
#include <mpi.h>

#include "mpi_timing.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

namespace {

using namespace dtensor;

struct Pattern {
  std::string_view name;
  const char* mesh;
  std::vector<std::pair<const char*, const char*>> pairs;  // cycled over the tensors
  // Columns of every tensor, and how many times the global tensor is the larger side per rank
  // (sizes are per rank): all-to-all's column pieces are 1/8 of a row.
  std::int64_t cols = 16;
  int spread = 1;
};

// The floor under a batch: each of its rounds as one bare blocking MPI call on buffers of the
// round's packed size on this rank (reductions in float, as the backend reduces f16 and bf16),
// without packing or the executor. Empty when a round is not a plain collective.
template <std::size_t N>
std::function<void()> bare_rounds(const BatchPlan<N>& plan, int rank) {
  struct Call {
    StepKind kind;
    MPI_Comm comm;
    int count;  // bytes for gathers and all-to-alls, floats for reductions (per member for RS)
    int group;
  };
  std::vector<Call> calls;
  const DeviceMesh& mesh = plan[0].src().mesh();
  const MeshCoord me = mesh.coordinate(rank);
  std::size_t largest = 0;
  for (std::size_t r = 0; r < plan.rounds().size(); ++r) {
    const BatchRound& round = plan.rounds()[r];
    const int k = round.mesh_dim;
    if (k < 0 || round.kind == StepKind::exchange) return {};
    std::int64_t before = 0, after = 0;
    for (std::size_t t = 0; t < plan.size(); ++t)
      for (std::size_t i = 0; i < plan[t].size(); ++i) {
        if (plan.round_of(t, i) != static_cast<int>(r)) continue;
        const Plan& p = plan[t];
        const std::int64_t reduced_elem =
            round.kind == StepKind::all_gather || round.kind == StepKind::all_to_all
                ? p.src().elem_bytes()
                : 4;
        before += p.src().local_box(p[i].before, me).numel() * reduced_elem;
        after += p.src().local_box(p[i].after, me).numel() * reduced_elem;
      }
    // The ranks of this rank's group on mesh dim k: those equal to it on every other dim.
    int color = 0;
    for (int j = 0; j < mesh.ndim(); ++j)
      if (j != k) color = color * mesh.size(j) + me[j];
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &comm);
    const int g = mesh.size(k);
    const std::int64_t count = round.kind == StepKind::all_gather       ? before
                               : round.kind == StepKind::reduce_scatter ? after / 4
                               : round.kind == StepKind::all_reduce     ? before / 4
                                                                        : before / g;
    calls.push_back({round.kind, comm, static_cast<int>(count), g});
    largest = std::max(largest, static_cast<std::size_t>(std::max(before, after) * g));
  }
  auto in = std::make_shared<std::vector<float>>(largest / 4 + 1, 1.0f);
  auto out = std::make_shared<std::vector<float>>(largest / 4 + 1);
  return [calls, in, out] {
    for (const Call& c : calls) switch (c.kind) {
        case StepKind::all_gather:
          MPI_Allgather(in->data(), c.count, MPI_BYTE, out->data(), c.count, MPI_BYTE, c.comm);
          break;
        case StepKind::reduce_scatter:
          MPI_Reduce_scatter_block(in->data(), out->data(), c.count, MPI_FLOAT, MPI_SUM, c.comm);
          break;
        case StepKind::all_reduce:
          MPI_Allreduce(in->data(), out->data(), c.count, MPI_FLOAT, MPI_SUM, c.comm);
          break;
        default:
          MPI_Alltoall(in->data(), c.count, MPI_BYTE, out->data(), c.count, MPI_BYTE, c.comm);
          break;
      }
  };
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int iterations = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  const std::string_view only = argc > 2 ? argv[2] : "";
  MpiBackend::Options options;
  if (argc > 3) {
    const int kib = std::atoi(argv[3]);
    options.batched_all_to_all_from_bytes = options.batched_all_gather_from_bytes =
        kib < 0 ? std::numeric_limits<std::size_t>::max() : std::size_t(kib) << 10;
  }
  const PlanOptions plan_options{
      .memory = argc > 4 && std::string_view(argv[4]) == "bounded" ? Memory::bounded : Memory::any};
  const std::string mesh_1d = fmt::format("{}", size);
  const std::string mesh_2d = size % 2 == 0 ? fmt::format("2x{}", size / 2) : mesh_1d;
  const Pattern patterns[] = {
      {"all-gather (FSDP params)", mesh_1d.c_str(), {{"S(0)", "R"}}},
      {"reduce-scatter (grads)", mesh_1d.c_str(), {{"P", "S(0)"}}},
      {"all-reduce (grads, 2-D)", mesh_2d.c_str(), {{"P,R", "R,R"}}},
      {"all-to-all (sequence)", mesh_1d.c_str(), {{"S(0)", "S(1)"}}, 256, size},
      {"mixed",
       mesh_2d.c_str(),
       {{"S(0),R", "R,R"}, {"P,S(0)", "S(0),S(0)"}, {"R,S(0)", "R,S(1)"}}},
  };
  constexpr int tensors = 64;
  if (rank == 0)
    fmt::print(
        "# {} ranks, {} tensors per batch (f32 and bf16), median of {} runs; sizes: the larger "
        "side per rank; bare: the batch's rounds as bare MPI calls, no packing; fewest calls: "
        "BatchSchedule::fewest_calls (= where its rounds are the fused ones)\n{:<26} {:<16} "
        "{:>13} {:>12} {:>12} {:>12} {:>8} {:>10} {:>16} {:>8}\n",
        size, tensors, iterations, "pattern", "sizes", "collectives", "one by one us", "batched us",
        "bare us", "speedup", "bare/one", "fewest calls us", "scratch");
  for (const std::int64_t smallest : {std::int64_t{4096}, std::int64_t{256}})
    for (const Pattern& p : patterns) {
      if (!p.name.starts_with(only)) continue;
      const DeviceMesh mesh = parse_mesh(p.mesh);
      MpiBackend backend(mesh, MPI_COMM_WORLD, options);
      std::vector<Redistribution> batch;
      for (int t = 0; t < tensors; ++t) {
        // 4 KiB to 256 KiB per rank on the larger side: rows of 256 f32 (1 KiB) or bf16.
        const std::int64_t bytes = smallest << (t % 7);  // smallest, twice, ..., 64 times
        const DType dtype = t % 2 == 0 ? DType::f32 : DType::bf16;
        const std::int64_t row_bytes = p.cols * static_cast<std::int64_t>(size_of(dtype));
        const std::int64_t rows =
            std::max<std::int64_t>(bytes * p.spread / row_bytes / size * size, size);
        const auto& [from, to] = p.pairs[static_cast<std::size_t>(t) % p.pairs.size()];
        batch.push_back({Layout(mesh, parse_placements(from), {rows, p.cols}, dtype),
                         Layout(mesh, parse_placements(to), {rows, p.cols}, dtype)});
      }
      const auto plan =
          std::make_unique<BatchPlan<tensors>>(plan_batch<tensors>(batch, plan_options));
      const auto fewest = std::make_unique<BatchPlan<tensors>>(
          plan_batch<tensors>(batch, plan_options, BatchSchedule::fewest_calls));
      const bool aligned = fewest->rounds() != plan->rounds();
      std::vector<std::vector<std::byte>> in, out;
      std::vector<TensorBuffers> buffers;
      std::int64_t least = 0, most = 0;  // the larger side's bytes per rank
      std::int64_t packed = 0;           // the packed size of the larger side on this rank
      for (int t = 0; t < tensors; ++t) {
        const Plan& one = (*plan)[static_cast<std::size_t>(t)];
        in.emplace_back(static_cast<std::size_t>(one.src().local_bytes(rank)), std::byte{1});
        out.emplace_back(static_cast<std::size_t>(one.dst().local_bytes(rank)));
        const std::int64_t larger =
            std::max(one.src().max_local_bytes(), one.dst().max_local_bytes());
        least = t == 0 ? larger : std::min(least, larger);
        packed += std::max(one.src().local_bytes(rank), one.dst().local_bytes(rank));
        most = std::max(most, larger);
      }
      for (int t = 0; t < tensors; ++t) {
        const auto u = static_cast<std::size_t>(t);
        buffers.push_back({in[u].data(), in[u].size(), out[u].data(), out[u].size()});
      }
      const double one_by_one = bench::median_seconds(
          [&] {
            for (int t = 0; t < tensors; ++t) {
              const auto u = static_cast<std::size_t>(t);
              execute((*plan)[u], backend, in[u].data(), in[u].size(), out[u].data(),
                      out[u].size());
            }
          },
          iterations);
      const double batched = bench::median_seconds(
          [&] { execute(*plan, backend, std::span<const TensorBuffers>(buffers)); }, iterations);
      const double fewest_calls =
          aligned ? bench::median_seconds(
                        [&] { execute(*fewest, backend, std::span<const TensorBuffers>(buffers)); },
                        iterations)
                  : batched;
      const std::function<void()> bare = bare_rounds(*plan, rank);
      const double floor = bare ? bench::median_seconds(bare, iterations) : 0;
      if (rank == 0)
        fmt::print(
            "{:<26} {:<16} {:>5} / {:<5} {:>12.1f} {:>12.1f} {:>12} {:>7.1f}x {:>10} {:>16} "
            "{:>8.2f}\n",
            p.name, fmt::format("{} B-{} KiB", least, most / 1024), plan->collectives(),
            plan->collectives_unbatched(), one_by_one * 1e6, batched * 1e6,
            bare ? fmt::format("{:.1f}", floor * 1e6) : "-", one_by_one / batched,
            bare ? fmt::format("{:.1f}x", one_by_one / floor) : "-",
            aligned ? fmt::format("{:.1f} ({} calls)", fewest_calls * 1e6, fewest->backend_calls())
                    : "=",
            static_cast<double>(workspace_bytes(*plan, backend)) /
                static_cast<double>(std::max<std::int64_t>(packed, 1)));
    }
  MPI_Finalize();
  return 0;
}
