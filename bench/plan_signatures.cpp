// Each case's plans in one line per option set, for telling whether a change to the planner
// changes any plan (bench/plan_signatures.sh runs it on two versions of the headers and diffs
// the output): reads one case per line on stdin in compare_plan_time's format,
//   MESH SHAPE DTYPE FROM TO        e.g.  2x4 8x16 f32 S(0),R R,S(0)
// and prints, for each of the option sets below, the case, the set's name, the plan's steps
// (kind and mesh dim), its estimated time, its bytes_recv_max and its lower bound.
#include "plan_cases.hpp"

#include <fmt/core.h>

#include <iostream>
#include <string>
#include <utility>

int main() {
  using dtensor::Memory;
  using dtensor::Objective;
  using dtensor::PlanOptions;
  const std::pair<const char*, PlanOptions> sets[] = {
      {"default", PlanOptions{}},
      {"bytes", PlanOptions{.objective = Objective::bytes}},
      {"bounded", PlanOptions{.memory = Memory::bounded}},
      {"seek", PlanOptions{.bounded_from_bytes = 0}},  // Memory::automatic at every size
  };
  return dtensor::bench::for_each_plan_case(
      std::cin, "plan_signatures",
      [&](const dtensor::Layout& src, const dtensor::Layout& dst) {
        const std::string what = fmt::format("{} {} {} {} -> {}", src.mesh(), src.global_shape(),
                                             src.dtype(), src.placements(), dst.placements());
        for (const auto& [name, options] : sets) {
          const dtensor::Plan plan = dtensor::plan_redistribute(src, dst, options);
          std::string steps;
          for (const dtensor::Step& s : plan)
            steps += fmt::format(" {}{}", dtensor::name(s.kind), s.mesh_dim);
          fmt::print("{} | {} |{} | {:.9g} {} {}\n", what, name, steps, plan.est_us(),
                     plan.bytes_recv_max(), plan.lower_bound_bytes_recv_max());
        }
      },
      [] {});
}
