#pragma once

#include <cuda_runtime.h>

#include <span>
#include <vector>

#include "../backend/simulated_device.cuh"
#include "../execute.hpp"
#include "../verify.hpp"
#include "check.hpp"
#include "device_ops.cuh"

// The global-view check of a plan on device memory: every rank of the mesh on one GPU
// (DeviceSimulatedWorld), sources copied to the device, results copied back and checked like
// verify_on_simulator's.
namespace dtensor::cuda {

namespace detail {

template <class T>
void run_on_device_simulator(const Plan& plan, std::vector<std::vector<T>>& in,
                             std::vector<std::vector<T>>& out, std::vector<RankBytes>& measured) {
  const DeviceMesh& mesh = plan.src().mesh();
  DeviceSimulatedWorld world(mesh);
  world.run([&](DeviceSimulatedBackend& b) {
    const auto i = static_cast<std::size_t>(mesh.index_of(b.rank()));
    const DeviceOps ops = b.local_ops();
    const std::size_t src_bytes = in[i].size() * sizeof(T), dst_bytes = out[i].size() * sizeof(T);
    auto src = ops.allocate(src_bytes);
    auto dst = ops.allocate(dst_bytes);
    cudaStream_t s = ops.stream();
    if (src_bytes)
      check(cudaMemcpyAsync(src.data(), in[i].data(), src_bytes, cudaMemcpyHostToDevice, s),
            "cudaMemcpyAsync");
    execute(plan, b, src.data(), src_bytes, dst.data(), dst_bytes);
    if (dst_bytes)
      check(cudaMemcpyAsync(out[i].data(), dst.data(), dst_bytes, cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync");
    if (src_bytes)
      check(cudaMemcpyAsync(in[i].data(), src.data(), src_bytes, cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  });
  for (int i = 0; i < mesh.size(); ++i) measured.push_back(world.bytes(mesh.rank_at(i)));
}

}  // namespace detail

// Runs `plan` with every rank on this process's current GPU, the global view as data, and
// checks every rank's result and the bytes it moved.
inline Verification verify_on_device_simulator(const Plan& plan) {
  return dtensor::detail::visit_dtype(plan.src().dtype(), [&]<class T>() {
    return dtensor::detail::verify_typed<T>(plan, &detail::run_on_device_simulator<T>);
  });
}

}  // namespace dtensor::cuda
