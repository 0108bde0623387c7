// Instructions per plan_redistribute call, case by case, under callgrind (bench/README.md,
// "Instructions per plan"): reads one case per line on stdin in compare_plan_time's format,
//   MESH SHAPE DTYPE FROM TO        e.g.  2x4 8x16 f32 S(0),R R,S(0)
// plans each once (warm), then `kPlans` times between a reset of callgrind's counters and a
// dump, so that dump i holds case i's instructions times kPlans. Run by
// bench/plan_instructions.sh, which reads the dumps; outside callgrind it only plans.
#include <dtensor/dtensor.hpp>

#include <valgrind/callgrind.h>

#include <fmt/core.h>

#include <exception>
#include <iostream>
#include <sstream>
#include <string>

namespace {

using namespace dtensor;

constexpr int kPlans = 4;

template <class T>
void keep(const T& value) {
  __asm__ __volatile__("" : : "g"(&value) : "memory");
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream fields(line);
    std::string mesh, shape, dtype, from, to;
    if (!(fields >> mesh >> shape >> dtype >> from >> to)) {
      fmt::print(stderr, "plan_instructions: expected 'MESH SHAPE DTYPE FROM TO', got '{}'\n",
                 line);
      return 2;
    }
    try {
      const DeviceMesh m = parse_mesh(mesh);
      const Layout src(m, parse_placements(from), parse_shape(shape), parse_dtype(dtype));
      const Layout dst(m, parse_placements(to), parse_shape(shape), parse_dtype(dtype));
      keep(plan_redistribute(src, dst));
      CALLGRIND_ZERO_STATS;
      for (int i = 0; i < kPlans; ++i) {
        keep(src);
        const Plan plan = plan_redistribute(src, dst);
        keep(plan);
      }
      CALLGRIND_DUMP_STATS;
    } catch (const std::exception& e) {
      CALLGRIND_ZERO_STATS;
      CALLGRIND_DUMP_STATS;  // one dump per case: this one counts nothing
      fmt::print(stderr, "plan_instructions: {}: {}\n", line, e.what());
    }
  }
}
