// Run-time planning latency per case, for compare.py: reads one case per line on stdin,
//   MESH SHAPE DTYPE FROM TO        e.g.  2x4 8x16 f32 S(0),R R,S(0)
// (dtensor-plan's spellings), and prints one line per case: the nanoseconds of one
// plan_redistribute(src, dst) call with default options, then the plan's step count; or, for a
// case dtensor refuses, "error" (the reason goes to stderr).
#include "../plan_cases.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>

namespace {

using namespace dtensor;
using bench::keep;
using clock_type = std::chrono::steady_clock;

// Nanoseconds per call of plan_redistribute(src, dst): the fastest of 7 batches of at least
// 200 µs (on a shared machine, slower batches measure other processes).
double time_plan(const Layout& src, const Layout& dst) {
  auto batch = [&](std::int64_t calls) {
    const auto start = clock_type::now();
    for (std::int64_t i = 0; i < calls; ++i) {
      keep(src);
      const Plan plan = plan_redistribute(src, dst);
      keep(plan);
    }
    return std::chrono::duration<double, std::nano>(clock_type::now() - start).count();
  };
  std::int64_t calls = 1;
  while (batch(calls) < 200e3) calls *= 2;
  double fastest = batch(calls);
  for (int i = 1; i < 7; ++i) fastest = std::min(fastest, batch(calls));
  return fastest / double(calls);
}

}  // namespace

int main() {
  return bench::for_each_plan_case(
      std::cin, "plan_time",
      [](const Layout& src, const Layout& dst) {
        const double ns = time_plan(src, dst);
        fmt::print("{:.1f} {}\n", ns, plan_redistribute(src, dst).size());
      },
      [] { fmt::print("error\n"); });
}
