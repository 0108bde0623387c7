// Run-time planning latency per case, for compare.py: reads one case per line on stdin,
//   MESH SHAPE DTYPE FROM TO        e.g.  2x4 8x16 f32 S(0),R R,S(0)
// (dtensor-plan's spellings), and prints one line per case: the nanoseconds of one
// plan_redistribute(src, dst) call with default options, then the plan's step count; or, for a
// case dtensor refuses, "error" (the reason goes to stderr).
#include <dtensor/dtensor.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>

namespace {

using namespace dtensor;
using clock_type = std::chrono::steady_clock;

// Keeps the compiler from hoisting or dropping a computation on `value` (what Google
// Benchmark's DoNotOptimize does).
template <class T>
void keep(const T& value) {
  __asm__ __volatile__("" : : "g"(&value) : "memory");
}

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
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream fields(line);
    std::string mesh, shape, dtype, from, to;
    if (!(fields >> mesh >> shape >> dtype >> from >> to)) {
      fmt::print(stderr, "plan_time: expected 'MESH SHAPE DTYPE FROM TO', got '{}'\n", line);
      return 2;
    }
    try {
      const DeviceMesh m = parse_mesh(mesh);
      const Shape s = parse_shape(shape);
      const DType t = parse_dtype(dtype);
      const Layout src(m, parse_placements(from), s, t);
      const Layout dst(m, parse_placements(to), s, t);
      const double ns = time_plan(src, dst);
      fmt::print("{:.1f} {}\n", ns, plan_redistribute(src, dst).size());
    } catch (const std::exception& e) {
      fmt::print("error\n");
      fmt::print(stderr, "plan_time: {}: {}\n", line, e.what());
    }
  }
  return 0;
}
