#pragma once

// Random tensors for the batch tests, on the host and on the device.
#include <dtensor/dtensor.hpp>

#include <array>
#include <random>

namespace dtensor::testing {

// A random tensor of a batch on `mesh`: shape of 1 to 3 dims (even, uneven, with empty
// shards), dtype, and placements from R, S(d), P(sum), P(max).
inline Redistribution random_redistribution(std::mt19937& rng, const DeviceMesh& mesh) {
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  const int ndim = 1 + pick(3);
  Shape shape;
  for (int d = 0; d < ndim; ++d)
    shape.push_back(std::array<std::int64_t, 6>{1, 3, 4, 7, 8, 16}[pick(6)]);
  const DType dtypes[] = {DType::f32, DType::i64, DType::bf16, DType::f16, DType::i32};
  const DType dtype = dtypes[pick(5)];
  auto placements = [&] {
    Placements ps;
    for (int k = 0; k < mesh.ndim(); ++k) {
      const int c = pick(4);
      ps.push_back(c == 0   ? Placement::replicate()
                   : c == 1 ? Placement::shard(pick(ndim))
                   : c == 2 ? Placement::partial(ReduceOp::sum)
                            : (pick(2) == 0 ? Placement::shard(pick(ndim))
                                            : Placement::partial(ReduceOp::max)));
    }
    return ps;
  };
  return {Layout(mesh, placements(), shape, dtype), Layout(mesh, placements(), shape, dtype)};
}

}  // namespace dtensor::testing
