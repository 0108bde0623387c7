#pragma once

#include <cuda_runtime.h>

#include "../cuda/check.hpp"
#include "../cuda/device_ops.cuh"
#include "simulated.hpp"

// Every rank of a mesh on one GPU: each rank a host thread with its own stream, its buffers
// separate device allocations. Collectives are device copies and the reduction kernels, ordered
// between ranks by events, never by waiting on the host; the same rendezvous, group order and
// byte counts as the host SimulatedWorld, so the device data path (kernels, streams, staging,
// padding) gets the same global-view check as the host path.
namespace dtensor {

namespace detail {

// One simulated rank on the device: a non-blocking stream and an event per fence phase.
class DeviceLane {
 public:
  static constexpr MemorySpace memory = MemorySpace::device;
  // The device every rank of the world runs on.
  struct Setting {
    int device = 0;
  };

  // Made on the caller's thread, whose current device it leaves as it was.
  DeviceLane(int /*rank index*/, const Setting& setting) : device_(setting.device) {
    int previous = 0;
    cuda::check(cudaGetDevice(&previous), "cudaGetDevice");
    cuda::check(cudaSetDevice(device_), "cudaSetDevice");
    cudaError_t status = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    for (cudaEvent_t& e : events_)
      if (status == cudaSuccess) status = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    (void)cudaSetDevice(previous);
    if (status != cudaSuccess) {
      destroy();
      cuda::check(status, "cudaStreamCreate/cudaEventCreate");
    }
  }
  DeviceLane(const DeviceLane&) = delete;
  DeviceLane& operator=(const DeviceLane&) = delete;
  ~DeviceLane() { destroy(); }

  // The rank's thread works on the world's device.
  void attach() { cuda::check(cudaSetDevice(device_), "cudaSetDevice"); }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] cuda::DeviceOps ops() const noexcept { return cuda::DeviceOps(stream_); }

  const void* publish(int phase) {
    cudaEvent_t e = events_[static_cast<std::size_t>(phase)];
    cuda::check(cudaEventRecord(e, stream_), "cudaEventRecord");
    return e;
  }
  void await(const void* token) {
    cuda::check(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(const_cast<void*>(token)), 0),
                "cudaStreamWaitEvent");
  }
  void finish() { cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  void destroy() noexcept {
    for (cudaEvent_t& e : events_)
      if (e != nullptr) (void)cudaEventDestroy(e), e = nullptr;
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_), stream_ = nullptr;
  }
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t events_[3] = {};
};

}  // namespace detail

// All ranks of a mesh on one GPU, one thread and one stream each.
using DeviceSimulatedWorld = BasicSimulatedWorld<detail::DeviceLane>;
// One rank of a DeviceSimulatedWorld: device buffers, ordered on lane().stream().
using DeviceSimulatedBackend = BasicSimulatedBackend<detail::DeviceLane>;

}  // namespace dtensor
