#include <dtensor/dtensor.hpp>

#include <fmt/core.h>

int main() {
  using namespace dtensor;
  constexpr DeviceMesh mesh({2, 4});
  constexpr Layout from(mesh, {Shard(0), Replicate()}, {1024, 4096}, DType::bf16);
  constexpr Layout to(mesh, {Replicate(), Shard(0)}, {1024, 4096}, DType::bf16);
  static_assert(plan_redistribute(from, to).size() == 1);
  const Plan plan = plan_redistribute(from, to);
  fmt::print("dtensor {} consumer: {}\n", DTENSOR_VERSION_STRING, plan);
  return plan.bytes_recv_max() == plan.lower_bound_bytes_recv_max() ? 0 : 1;
}
