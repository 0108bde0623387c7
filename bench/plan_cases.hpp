// The case list that bench/plan_instructions, plan_signatures and compare_plan_time read: one
// redistribution per line on a stream, in dtensor-plan's spellings,
//   MESH SHAPE DTYPE FROM TO        e.g.  2x4 8x16 f32 S(0),R R,S(0)
#pragma once

#include <dtensor/dtensor.hpp>

#include <fmt/core.h>

#include <exception>
#include <istream>
#include <sstream>
#include <string>
#include <string_view>

namespace dtensor::bench {

// Keeps the compiler from hoisting or dropping a computation on `value` (what Google
// Benchmark's DoNotOptimize does).
template <class T>
void keep(const T& value) {
  __asm__ __volatile__("" : : "g"(&value) : "memory");
}

// Calls on_case(src, dst) for each case read from `in`, in order. A case dtensor refuses (a
// spelling or layout it rejects, or on_case throwing) gets on_refused() instead, and its reason
// goes to stderr after `program`'s name. Returns 2 at the first line that is not five fields
// (said on stderr), else 0.
template <class OnCase, class OnRefused>
int for_each_plan_case(std::istream& in, std::string_view program, OnCase&& on_case,
                       OnRefused&& on_refused) {
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string mesh, shape, dtype, from, to;
    if (!(fields >> mesh >> shape >> dtype >> from >> to)) {
      fmt::print(stderr, "{}: expected 'MESH SHAPE DTYPE FROM TO', got '{}'\n", program, line);
      return 2;
    }
    try {
      const DeviceMesh m = parse_mesh(mesh);
      const Shape s = parse_shape(shape);
      const DType t = parse_dtype(dtype);
      on_case(Layout(m, parse_placements(from), s, t), Layout(m, parse_placements(to), s, t));
    } catch (const std::exception& e) {
      on_refused();
      fmt::print(stderr, "{}: {}: {}\n", program, line, e.what());
    }
  }
  return 0;
}

}  // namespace dtensor::bench
