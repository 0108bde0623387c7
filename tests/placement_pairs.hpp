#pragma once

// The exhaustive (source, target) matrices the planner and execution tests share: every pair
// of placements drawn from one list, on one mesh.
#include <dtensor/dtensor.hpp>

#include <cstdlib>
#include <span>

namespace dtensor::testing {

// Every how many pairs the exhaustive tests run one: DTENSOR_EXHAUSTIVE_STRIDE (default 1,
// all of them). The sanitizer preset samples, since it runs the tests several times slower.
inline int exhaustive_stride() {
  const char* text = std::getenv("DTENSOR_EXHAUSTIVE_STRIDE");
  const int stride = text != nullptr ? std::atoi(text) : 1;
  return stride > 0 ? stride : 1;
}

// Calls f(x, y, source, target) for every pair of placement lists on `mesh` whose entries
// come from `options` (x and y number the lists), or every `stride`-th pair.
template <class F>
void for_each_pair(const DeviceMesh& mesh, std::span<const Placement> options, F&& f,
                   int stride = exhaustive_stride()) {
  const int n = static_cast<int>(options.size());
  int combos = 1;
  for (int k = 0; k < mesh.ndim(); ++k) combos *= n;
  for (int x = 0; x < combos; ++x)
    for (int y = 0; y < combos; ++y) {
      if ((x * combos + y) % stride != 0) continue;
      Placements a, b;
      for (int k = 0, rx = x, ry = y; k < mesh.ndim(); ++k, rx /= n, ry /= n) {
        a.push_back(options[static_cast<std::size_t>(rx % n)]);
        b.push_back(options[static_cast<std::size_t>(ry % n)]);
      }
      f(x, y, a, b);
    }
}

// Whether placements `ps` make a layout of `dtype`: Partial(avg) needs a floating dtype.
inline bool placements_fit(const Placements& ps, DType dtype) {
  for (const Placement& p : ps)
    if (p.is_partial(ReduceOp::avg) && !is_floating(dtype)) return false;
  return true;
}

}  // namespace dtensor::testing
