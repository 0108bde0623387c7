#include "gpu.hpp"

#include <dtensor/backend/simulated_device.cuh>
#include <dtensor/cuda/check.hpp>
#include <dtensor/cuda/device_ops.cuh>
#include <dtensor/cuda/verify.cuh>
#include <dtensor/execute.hpp>

namespace dtensor::testing::gpu {

// Device links fill in place (cuda::DeviceOps::fill_around_in_place): a fill whose block lies
// in its target runs there, as on the host.
static_assert(detail::abilities_of<detail::Link<DeviceSimulatedBackend>>.fills_in_place);

namespace {
const cuda::DeviceOps ops(nullptr);
void done() { cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
}  // namespace

Verification verify(const Plan& plan) { return cuda::verify_on_device_simulator(plan); }
BatchVerification verify_batch(const BatchPlan<16>& batch) {
  return cuda::verify_batch_on_device_simulator(batch);
}

void copy_box(const void* src, const Shape& src_shape, const Shape& src_at, void* dst,
              const Shape& dst_shape, const Shape& dst_at, const Shape& extent, std::size_t elem) {
  ops.copy_box(src, src_shape, src_at, dst, dst_shape, dst_at, extent, elem);
  done();
}
void pack_pieces(const void* block, const Shape& shape, int dim, int g, void* packed,
                 std::size_t elem) {
  ops.pack_pieces(block, shape, dim, g, packed, elem);
  done();
}
void unpack_pieces(const void* packed, void* block, const Shape& shape, int dim, int g,
                   std::size_t elem) {
  ops.unpack_pieces(packed, block, shape, dim, g, elem);
  done();
}
void copy_runs(std::span<const RunCopy> copies) {
  ops.copy_runs(copies);
  done();
}
void fill_identity(DType dtype, void* data, std::size_t count, ReduceOp op) {
  ops.fill_identity(dtype, data, count, op);
  done();
}
void fill_around_in_place(DType dtype, void* data, const Shape& inner, const Shape& outer,
                          const Shape& at, ReduceOp op) {
  ops.fill_around_in_place(dtype, data, inner, outer, at, op);
  done();
}
void divide(DType dtype, void* data, std::size_t count, int g) {
  ops.divide(dtype, data, count, g);
  done();
}
void multiply(DType dtype, void* data, std::size_t count, int g) {
  ops.multiply(dtype, data, count, g);
  done();
}
void reduce(DType dtype, void* out, std::span<const void* const> parts, std::size_t count,
            ReduceOp op) {
  ops.reduce(dtype, out, parts, count, op);
  done();
}

void run_with_sizes(const Plan& plan, std::size_t src_bytes, std::size_t dst_bytes) {
  DeviceSimulatedWorld world(plan.src().mesh());
  world.run([&](DeviceSimulatedBackend& b) {
    auto src = b.local_ops().allocate(src_bytes), dst = b.local_ops().allocate(dst_bytes);
    execute(plan, b, src.data(), src.size(), dst.data(), dst.size());
  });
}

}  // namespace dtensor::testing::gpu
