// Random redistributions over MPI under mpirun -np 8: meshes of 8 ranks in 1 to 3 dims (and
// with dims of extent 1), shapes of 1 to 3 dims with empty and uneven blocks, every placement
// and reduce op, seven dtypes and every planner option; each run on every rank's block of the
// global view and checked against the simulated backend (run_against_simulator.hpp). Cases
// rotate over four backends per mesh: default options; the paths meant for large blocks at any
// size (reductions by messages and single-copy all-to-alls, where the kernel allows it, from 0
// bytes), the copies' rows through the staging buffer; the same with rows moved straight, in
// bands of a few rows (strided all-gathers by single copy too); and neither. A third of the cases
// run through execute_async (started, polled, waited for), with the same checks.
//
//   mpirun -np 8 test_mpi_random [cases] [seed]      (ctest: 400 cases, seed 1)
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>

#include "agreement.hpp"
#include "run_against_simulator.hpp"

#include <fmt/core.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>

namespace {

using namespace dtensor;

// One random case: the same on every rank, from the same generator state.
struct RandomCase {
  DeviceMesh mesh;
  Placements from, to;
  Shape shape;
  DType dtype = DType::f32;
  PlanOptions options;
};

RandomCase draw(std::mt19937& rng) {
  static constexpr const char* meshes[] = {"8", "2x4", "4x2", "2x2x2", "2x2x2x1", "1x8", "2x1x4"};
  static constexpr ReduceOp ops[] = {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::product,
                                     ReduceOp::avg};
  static constexpr DType dtypes[] = {DType::f32, DType::i64, DType::bf16, DType::f64,
                                     DType::i32, DType::f16, DType::u8};
  auto below = [&](unsigned n) { return static_cast<int>(rng() % n); };
  RandomCase c;
  c.mesh = parse_mesh(meshes[below(7)]);
  const int tensor_ndim = 1 + below(3);
  for (int d = 0; d < tensor_ndim; ++d) c.shape.push_back(below(12));
  c.dtype = dtypes[below(7)];
  auto placement = [&]() -> Placement {
    const int kind = below(5);
    if (kind <= 1) return Replicate();
    if (kind <= 3) return Shard(below(static_cast<unsigned>(tensor_ndim)));
    // Partial(avg) needs a floating dtype; products of integers overflow quickly, so they
    // are half as frequent.
    ReduceOp op = ops[below(is_floating(c.dtype) ? 5 : 4)];
    if (op == ReduceOp::product && below(2) == 0) op = ReduceOp::sum;
    return Partial(op);
  };
  for (int k = 0; k < c.mesh.ndim(); ++k) {
    c.from.push_back(placement());
    c.to.push_back(placement());
  }
  switch (below(6)) {
    case 1: c.options.objective = Objective::bytes; break;
    case 2: c.options.memory = Memory::bounded; break;
    case 3: c.options.padding = Padding::never; break;
    case 4: c.options.padding = Padding::always; break;
    case 5: c.options.partial_from_replicate = PartialFromReplicate::keep_one; break;
    default: break;
  }
  return c;
}

// The backend's options for variant 0 (defaults), 1 (reductions, all-gathers and all-to-alls by
// messages and single copy at any size, rows staged), 2 (the same, rows straight, in bands of a
// row or a few, three threads sharing them) and 3 (none of them: MPI's collectives).
MpiBackend::Options backend_options(int variant) {
  MpiBackend::Options o;
  if (variant == 1 || variant == 2) {
    o.reduce_by_messages_from_bytes = 0;
    o.move_by_messages_below_bytes = std::numeric_limits<std::size_t>::max();
    o.single_copy = MpiBackend::SingleCopy::always;
    o.single_copy_from_bytes = 0;
    o.single_copy_direct_write_from_bytes = o.single_copy_direct_read_from_bytes =
        variant == 1 ? std::numeric_limits<std::size_t>::max() : 0;
    if (variant == 2) {
      o.single_copy_band_bytes = 64;  // bands of a row or a few, split between three threads
      o.single_copy_threads = 3;
      o.single_copy_threads_from_bytes = 0;
    }
  } else if (variant == 3) {
    o.reduce_by_messages_from_bytes = std::numeric_limits<std::size_t>::max();
    o.move_by_messages_below_bytes = 0;
    o.single_copy = MpiBackend::SingleCopy::never;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  const int cases = argc > 1 ? std::atoi(argv[1]) : 400;
  const auto seed = static_cast<std::uint32_t>(argc > 2 ? std::atoi(argv[2]) : 1);
  std::mt19937 rng(seed);
  testing::Agreement verdict(world_rank);
  // One per mesh shape and set of options (backend_options).
  std::map<std::string, std::unique_ptr<MpiBackend>> backends;
  int refused = 0;
  for (int i = 0; i < cases; ++i) {
    const RandomCase c = draw(rng);
    if (c.mesh.size() != world_size) continue;
    const std::string spelled =
        fmt::format("{} {} {} {} -> {} (case {}, seed {}, backend options {}{})", c.mesh, c.shape,
                    c.dtype, c.from, c.to, i, seed, i % 4, i % 3 == 1 ? ", execute_async" : "");
    Layout src, dst;
    try {
      src = Layout(c.mesh, c.from, c.shape, c.dtype);
      dst = Layout(c.mesh, c.to, c.shape, c.dtype);
    } catch (const error&) {
      ++refused;  // e.g. a Shard of a dim the drawn shape does not have: refused everywhere
      continue;
    }
    const int variant = i % 4;
    const bool async = i % 3 == 1;  // a third of the cases through execute_async
    auto& backend = backends[fmt::format("{} {}", c.mesh, variant)];
    if (!backend)
      backend = std::make_unique<MpiBackend>(c.mesh, MPI_COMM_WORLD, backend_options(variant));
    std::string problem;
    try {
      problem = detail::visit_dtype(c.dtype, [&]<class T>() {
        return testing::run_against_simulator<T>(src, dst, *backend, nullptr, c.options, false,
                                                 async);
      });
    } catch (const std::exception& e) {
      problem = e.what();
    }
    verdict.agree(spelled, problem.empty(), problem);
  }
  backends.clear();
  if (world_rank == 0)
    fmt::print("mpi random (seed {}): {} passed, {} failed, {} layouts refused\n", seed,
               verdict.passed(), verdict.failed(), refused);
  const int failed = verdict.failed();
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
