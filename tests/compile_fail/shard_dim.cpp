// Must not compile: Shard(2) on a 2-d tensor, found in constant evaluation.
#include <dtensor/layout.hpp>

constexpr dtensor::Layout bad(dtensor::DeviceMesh({4}), {dtensor::Shard(2)}, {8, 8});
