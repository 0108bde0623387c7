#pragma once

// The device side of the GPU tests, compiled by nvcc (gpu.cu), called from Catch2 tests built by
// the host compiler: fmt's compile-time format checks do not build under nvcc, so CUDA
// translation units stay free of fmt and the tests that print keep to .cpp files.
#include <dtensor/batch_plan.hpp>
#include <dtensor/layout.hpp>
#include <dtensor/local_ops.hpp>
#include <dtensor/plan.hpp>
#include <dtensor/verify.hpp>

#include <cstddef>
#include <span>

namespace dtensor::testing::gpu {

// cuda::verify_on_device_simulator(plan).
Verification verify(const Plan& plan);
// cuda::verify_batch_on_device_simulator(batch).
BatchVerification verify_batch(const BatchPlan<16>& batch);

// cuda::DeviceOps on the default stream, each call synchronised.
void copy_box(const void* src, const Shape& src_shape, const Shape& src_at, void* dst,
              const Shape& dst_shape, const Shape& dst_at, const Shape& extent, std::size_t elem);
void pack_pieces(const void* block, const Shape& shape, int dim, int g, void* packed,
                 std::size_t elem);
void unpack_pieces(const void* packed, void* block, const Shape& shape, int dim, int g,
                   std::size_t elem);
void copy_runs(std::span<const RunCopy> copies);
void fill_identity(DType dtype, void* data, std::size_t count, ReduceOp op);
void fill_around_in_place(DType dtype, void* data, const Shape& inner, const Shape& outer,
                          const Shape& at, ReduceOp op);
void divide(DType dtype, void* data, std::size_t count, int g);
void multiply(DType dtype, void* data, std::size_t count, int g);
void reduce(DType dtype, void* out, std::span<const void* const> parts, std::size_t count,
            ReduceOp op);

// Runs `plan` on a DeviceSimulatedWorld with device buffers of the given sizes (contents
// undefined), for the error tests.
void run_with_sizes(const Plan& plan, std::size_t src_bytes, std::size_t dst_bytes);

}  // namespace dtensor::testing::gpu
