#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "../errors.hpp"

// CUDA runtime errors as dtensor::error exceptions that name the call and the error.
namespace dtensor::cuda {

// Throws dtensor::error("<call> failed: <error string> (<error name>)") unless `status` is
// cudaSuccess.
inline void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  throw error(std::string(call) + " failed: " + cudaGetErrorString(status) + " (" +
              cudaGetErrorName(status) + ")");
}

// Whether this process sees at least one CUDA device (false, not an error, on machines with no
// driver or no GPU).
inline bool device_available() noexcept {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace dtensor::cuda
