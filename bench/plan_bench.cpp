// Run-time planning latency of plan_redistribute on 1-D to 4-D meshes.
#include <benchmark/benchmark.h>

#include <dtensor/dtensor.hpp>

namespace {

using namespace dtensor;

struct Case {
  const char* mesh;
  const char* from;
  const char* to;
  Shape shape;
};

const Case cases[] = {
    {"8", "S(0)", "R", {1024, 4096}},
    {"8", "S(0)", "S(1)", {1024, 4096}},
    {"8", "P", "S(0)", {1024, 4096}},
    {"8", "S(0)", "R", {1000, 4095}},
    {"2x4", "S(0),R", "R,S(1)", {1024, 4096}},
    {"2x4", "S(0),R", "R,S(0)", {1024, 4096}},
    {"2x4", "P,S(1)", "R,S(0)", {1024, 4096}},
    {"2x4", "S(0),S(0)", "R,S(0)", {1000, 4095}},
    {"2x2x2", "S(0),S(1),R", "R,S(0),S(1)", {1024, 4096}},
    {"2x2x2", "P,S(0),R", "R,R,S(0)", {1024, 4096}},
    {"2x2x2x2", "S(0),R,S(1),R", "R,S(1),R,S(0)", {1024, 4096}},
    {"2x2x2x2", "P,S(0),S(1),R", "R,S(1),S(0),S(0)", {1024, 4096}},
    // Large meshes: the cost of a candidate grows with the ranks whose blocks differ.
    {"1024", "S(0)", "S(1)", {8192, 8192}},
    {"8x128", "S(0),R", "R,S(1)", {8192, 8192}},
    {"16x64", "S(0),R", "R,S(0)", {8192, 8192}},
    {"8x128", "S(0),S(1)", "S(1),S(0)", {8192, 8192}},
    // Uneven on large meshes: every rank whose blocks differ is costed.
    {"16x64", "S(0),R", "R,S(0)", {8190, 8192}},
    {"32x32", "S(1),P", "S(0),P(max)", {1024, 100}},
};

void plan_case(benchmark::State& state) {
  const Case& c = cases[state.range(0)];
  const DeviceMesh mesh = parse_mesh(c.mesh);
  const Layout src(mesh, parse_placements(c.from), c.shape, DType::bf16);
  const Layout dst(mesh, parse_placements(c.to), c.shape, DType::bf16);
  for (auto _ : state) {
    Plan plan = plan_redistribute(src, dst);
    benchmark::DoNotOptimize(plan);
  }
  state.SetLabel(fmt::format("{} {} -> {} {} ({} steps)", c.mesh, c.from, c.to, c.shape,
                             plan_redistribute(src, dst).size()));
}

// The same plan from a PlanCache that holds it (a hit): a hash and a comparison.
void cached_case(benchmark::State& state) {
  const Case& c = cases[state.range(0)];
  const DeviceMesh mesh = parse_mesh(c.mesh);
  const Layout src(mesh, parse_placements(c.from), c.shape, DType::bf16);
  const Layout dst(mesh, parse_placements(c.to), c.shape, DType::bf16);
  static PlanCache<16> cache;  // 58 KB: static storage
  cache.get(src, dst);
  for (auto _ : state) {
    const Plan& plan = cache.get(src, dst);
    benchmark::DoNotOptimize(&plan);
  }
  state.SetLabel(fmt::format("{} {} -> {} {}, cached", c.mesh, c.from, c.to, c.shape));
}

}  // namespace

BENCHMARK(plan_case)->DenseRange(0, std::size(cases) - 1);
BENCHMARK(cached_case)->Arg(0)->Arg(5)->Arg(11)->Arg(15);
BENCHMARK_MAIN();
