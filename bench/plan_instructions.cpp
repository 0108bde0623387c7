// Instructions per plan_redistribute call, case by case, under callgrind (bench/README.md,
// "Instructions per plan"): reads one case per line on stdin in compare_plan_time's format,
//   MESH SHAPE DTYPE FROM TO        e.g.  2x4 8x16 f32 S(0),R R,S(0)
// plans each once (warm), then `kPlans` times between a reset of callgrind's counters and a
// dump, so that dump i holds case i's instructions times kPlans. Run by
// bench/plan_instructions.sh, which reads the dumps; outside callgrind it only plans.
#include "plan_cases.hpp"

#include <valgrind/callgrind.h>

#include <iostream>

namespace {

constexpr int kPlans = 4;

}  // namespace

int main() {
  using dtensor::bench::keep;
  return dtensor::bench::for_each_plan_case(
      std::cin, "plan_instructions",
      [](const dtensor::Layout& src, const dtensor::Layout& dst) {
        keep(dtensor::plan_redistribute(src, dst));
        CALLGRIND_ZERO_STATS;
        for (int i = 0; i < kPlans; ++i) {
          keep(src);
          const dtensor::Plan plan = dtensor::plan_redistribute(src, dst);
          keep(plan);
        }
        CALLGRIND_DUMP_STATS;
      },
      [] {
        CALLGRIND_ZERO_STATS;
        CALLGRIND_DUMP_STATS;  // one dump per case: this one counts nothing
      });
}
