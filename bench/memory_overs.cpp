// How many plans hold more scratch than the larger of a rank's source and target blocks
// (issue 5's bound), over every pair of placements drawn from {R, S(0), S(1), P(sum), P(max)} on
// one mesh, of one dtype (f32 by default), at the shapes given: docs/execution.md's counts on
// 2x2x2, 3x2x2 and 2x2x2x2.
//
//   memory_overs [--mesh 2x2x2] [--dtype f32] [--stride N] [--bounded] [--bytes] SHAPE...
//
// For each shape and in all, it prints the pairs and how many are over on a backend that moves
// strided pieces where they lie (MPI, the simulator) and on one that packs them (NCCL), for
// plan_redistribute's plan and for plan_redistribute_for's plan for that backend. --stride N
// takes every N-th pair; --bounded plans under Memory::bounded (default Memory::automatic),
// --bytes under Objective::bytes. Nothing runs: scratch_within_ends weighs each plan.
#include <dtensor/backend/simulated.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/parse.hpp>

#include "packing_backend.hpp"
#include "placement_pairs.hpp"

#include <fmt/core.h>

#include <array>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace dtensor;

using testing::PackingBackend;

struct Overs {
  long pairs = 0;
  // [plan_redistribute, planned for the backend][strided, packing]
  std::array<std::array<long, 2>, 2> over{};

  void add(const Overs& o) {
    pairs += o.pairs;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) over[i][j] += o.over[i][j];
  }
  void print(std::string_view what) const {
    fmt::print(
        "{}: {} pairs; plan_redistribute over on strided {}, packing {}; planned for the "
        "backend over on strided {}, packing {}\n",
        what, pairs, over[0][0], over[0][1], over[1][0], over[1][1]);
  }
};

int run(int argc, char** argv) {
  DeviceMesh mesh = parse_mesh("2x2x2");
  DType dtype = DType::f32;
  int stride = 1;
  PlanOptions options;
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--mesh" && i + 1 < argc) {
      mesh = parse_mesh(argv[++i]);
    } else if (arg == "--dtype" && i + 1 < argc) {
      dtype = parse_dtype(argv[++i]);
    } else if (arg == "--stride" && i + 1 < argc) {
      stride = std::stoi(argv[++i]);
      if (stride < 1) throw std::invalid_argument(fmt::format("--stride {}: not positive", stride));
    } else if (arg == "--bounded") {
      options.memory = Memory::bounded;
    } else if (arg == "--bytes") {
      options.objective = Objective::bytes;
    } else if (!arg.empty() && arg[0] != '-') {
      shapes.push_back(parse_shape(arg));
    } else {
      throw std::invalid_argument(fmt::format("unknown argument '{}'", arg));
    }
  }
  if (shapes.empty())
    throw std::invalid_argument(
        "no shape: memory_overs [--mesh 2x2x2] [--dtype f32] [--stride N] [--bounded] [--bytes] "
        "SHAPE...");
  const std::array<Placement, 5> choices = {Placement::replicate(), Placement::shard(0),
                                            Placement::shard(1), Placement::partial(ReduceOp::sum),
                                            Placement::partial(ReduceOp::max)};
  Overs all;
  for (const Shape& shape : shapes) {
    Overs at;
    testing::for_each_pair(
        mesh, choices,
        [&](int, int, const Placements& a, const Placements& b) {
          const Layout src(mesh, a, shape, dtype), dst(mesh, b, shape, dtype);
          const Plan plan = plan_redistribute(src, dst, options);
          ++at.pairs;
          at.over[0][0] += scratch_within_ends<SimulatedBackend>(plan) ? 0 : 1;
          at.over[0][1] += scratch_within_ends<PackingBackend>(plan) ? 0 : 1;
          at.over[1][0] += scratch_within_ends<SimulatedBackend>(
                               plan_redistribute_for<SimulatedBackend>(src, dst, options))
                               ? 0
                               : 1;
          at.over[1][1] += scratch_within_ends<PackingBackend>(
                               plan_redistribute_for<PackingBackend>(src, dst, options))
                               ? 0
                               : 1;
        },
        stride);
    at.print(fmt::format("{} {} {}", mesh, shape, dtype));
    all.add(at);
  }
  if (shapes.size() > 1) all.print("all");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memory_overs: %s\n", e.what());
    return 2;
  }
}
