#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <utility>

#include "../dtype.hpp"
#include "../layout.hpp"
#include "../local_ops.hpp"
#include "../reduce_op.hpp"
#include "check.hpp"
#include "kernels.cuh"

// LocalOps on device memory: every operation is enqueued on one CUDA stream, staging comes from
// the stream-ordered allocator (cudaMallocAsync), and nothing waits on the host.
namespace dtensor::cuda {

// The local operations of a device backend, bound to its stream.
class DeviceOps {
 public:
  // A staging buffer from cudaMallocAsync on the stream, freed with cudaFreeAsync on it: safe
  // to drop as soon as the last work that uses it is enqueued.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(std::size_t bytes, bool zero, cudaStream_t stream) : size_(bytes), stream_(stream) {
      if (bytes == 0) return;
      void* p = nullptr;
      check(cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync");
      data_ = static_cast<std::byte*>(p);
      if (zero) check(cudaMemsetAsync(data_, 0, bytes, stream), "cudaMemsetAsync");
    }
    Buffer(Buffer&& o) noexcept
        : data_(std::exchange(o.data_, nullptr)),
          size_(std::exchange(o.size_, 0)),
          stream_(o.stream_) {}
    Buffer& operator=(Buffer&& o) noexcept {
      if (this != &o) {
        release();
        data_ = std::exchange(o.data_, nullptr);
        size_ = std::exchange(o.size_, 0);
        stream_ = o.stream_;
      }
      return *this;
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { release(); }

    [[nodiscard]] std::byte* data() const noexcept { return data_; }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }

   private:
    void release() noexcept {
      // A failure here means the context is already broken; the next checked call reports it.
      if (data_ != nullptr) (void)cudaFreeAsync(data_, stream_);
      data_ = nullptr;
    }
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    cudaStream_t stream_ = nullptr;
  };

  explicit DeviceOps(cudaStream_t stream) noexcept : stream_(stream) {}
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  [[nodiscard]] Buffer allocate(std::size_t bytes, bool zero = false) const {
    return Buffer(bytes, zero, stream_);
  }
  void copy(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
  }
  // Every copy in one kernel launch (up to cuda::detail::runs_per_launch a launch).
  void copy_runs(std::span<const RunCopy> copies) const { cuda::copy_runs(copies, stream_); }
  void copy_box(const void* src, const Shape& src_shape, const Shape& src_at, void* dst,
                const Shape& dst_shape, const Shape& dst_at, const Shape& extent,
                std::size_t elem) const {
    cuda::copy_box(src, src_shape, src_at, dst, dst_shape, dst_at, extent, elem, stream_);
  }
  void pack_pieces(const void* block, const Shape& shape, int dim, int g, void* packed,
                   std::size_t elem) const {
    cuda::pack_pieces(block, shape, dim, g, packed, elem, stream_);
  }
  void unpack_pieces(const void* packed, void* block, const Shape& shape, int dim, int g,
                     std::size_t elem) const {
    cuda::unpack_pieces(packed, block, shape, dim, g, elem, stream_);
  }
  void fill_identity(DType dtype, void* data, std::size_t count, ReduceOp op) const {
    cuda::fill_identity(dtype, data, count, op, stream_);
  }
  // The block moved in place into a larger one around it, the rest op's identity (a fill whose
  // block lies in its target: no second buffer).
  void fill_around_in_place(DType dtype, void* data, const Shape& inner, const Shape& outer,
                            const Shape& at, ReduceOp op) const {
    cuda::fill_around_in_place(dtype, data, inner, outer, at, op, stream_);
  }
  void divide(DType dtype, void* data, std::size_t count, int g) const {
    cuda::divide(dtype, data, count, g, stream_);
  }
  void multiply(DType dtype, void* data, std::size_t count, int g) const {
    cuda::multiply(dtype, data, count, g, stream_);
  }
  void reduce(DType dtype, void* out, std::span<const void* const> parts, std::size_t count,
              ReduceOp op) const {
    cuda::reduce(dtype, out, parts, count, op, stream_);
  }

 private:
  cudaStream_t stream_;
};

static_assert(LocalOps<DeviceOps>);

}  // namespace dtensor::cuda
