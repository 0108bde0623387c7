#pragma once

#include <cuda_runtime.h>

#include <span>
#include <vector>

#include "../backend/simulated_device.cuh"
#include "../batch_plan.hpp"
#include "../execute.hpp"
#include "../execute_batch.hpp"
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

template <std::size_t N>
std::int64_t run_batch_on_device_simulator(const void* batch, dtensor::detail::RankBlocks& in,
                                           dtensor::detail::RankBlocks& out,
                                           std::vector<RankBytes>& measured) {
  const auto& plan = *static_cast<const BatchPlan<N>*>(batch);
  const DeviceMesh& mesh = plan[0].src().mesh();
  DeviceSimulatedWorld world(mesh);
  world.run([&](DeviceSimulatedBackend& b) {
    const auto i = static_cast<std::size_t>(mesh.index_of(b.rank()));
    const DeviceOps ops = b.local_ops();
    cudaStream_t s = ops.stream();
    using Buffer = decltype(ops.allocate(0));
    std::vector<Buffer> src, dst;
    std::vector<TensorBuffers> buffers;
    for (std::size_t t = 0; t < plan.size(); ++t) {
      const std::size_t src_bytes = in[t][i].size(), dst_bytes = out[t][i].size();
      src.push_back(ops.allocate(src_bytes));
      dst.push_back(ops.allocate(dst_bytes));
      if (src_bytes)
        check(cudaMemcpyAsync(src.back().data(), in[t][i].data(), src_bytes, cudaMemcpyHostToDevice,
                              s),
              "cudaMemcpyAsync");
      buffers.push_back({src.back().data(), src_bytes, dst.back().data(), dst_bytes});
    }
    execute(plan, b, std::span<const TensorBuffers>(buffers));
    for (std::size_t t = 0; t < plan.size(); ++t) {
      if (!out[t][i].empty())
        check(cudaMemcpyAsync(out[t][i].data(), dst[t].data(), out[t][i].size(),
                              cudaMemcpyDeviceToHost, s),
              "cudaMemcpyAsync");
      if (!in[t][i].empty())
        check(cudaMemcpyAsync(in[t][i].data(), src[t].data(), in[t][i].size(),
                              cudaMemcpyDeviceToHost, s),
              "cudaMemcpyAsync");
    }
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  });
  for (int i = 0; i < mesh.size(); ++i) measured.push_back(world.bytes(mesh.rank_at(i)));
  return world.collectives();
}

}  // namespace detail

// Runs the batched plan with every rank on this process's current GPU, every tensor's global
// view as its data, and checks it like verify_batch_on_simulator.
template <std::size_t N>
BatchVerification verify_batch_on_device_simulator(const BatchPlan<N>& batch) {
  return dtensor::detail::verify_batch(batch, &detail::run_batch_on_device_simulator<N>);
}

// Runs `plan` with every rank on this process's current GPU, the global view as data, and
// checks every rank's result and the bytes it moved.
inline Verification verify_on_device_simulator(const Plan& plan) {
  return dtensor::detail::visit_dtype(plan.src().dtype(), [&]<class T>() {
    return dtensor::detail::verify_typed<T>(plan, &detail::run_on_device_simulator<T>);
  });
}

}  // namespace dtensor::cuda
