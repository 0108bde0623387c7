// Runs the GPU tests when this process sees a CUDA device; otherwise says so and exits with 77,
// which ctest reports as skipped. Catch2's implementation is tests/catch_session.cpp.
#include <dtensor/cuda/check.hpp>  // CUDA runtime API only: plain C++

#include <cstdio>

#include "../catch_session.hpp"

int main(int argc, char** argv) {
  if (!dtensor::cuda::device_available()) {
    std::printf("no CUDA device: skipping the GPU tests (they ran only to prove they build)\n");
    return 77;
  }
  return dtensor::testing::run_catch_session(argc, argv);
}
