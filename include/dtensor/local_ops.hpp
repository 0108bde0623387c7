#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "detail/box_copy.hpp"
#include "detail/elementwise.hpp"
#include "detail/expand_in_place.hpp"
#include "detail/host_block_cache.hpp"
#include "dtype.hpp"
#include "layout.hpp"
#include "reduce_op.hpp"

// The work a plan's run does on one rank's own memory, between collectives: staging buffers,
// packing and unpacking blocks, filling, scaling and reducing. HostOps does it on host memory;
// a device backend supplies its own (cuda/device_ops.cuh: kernels on a stream) through a
// `local_ops()` member, and execute() then runs the same steps on device buffers.
namespace dtensor {

// What execute() asks of a backend's local operations. All pointers are in the backend's memory
// space; `count` is in elements of `dtype`, `bytes` in bytes.
//  - allocate(bytes, zero): a staging buffer (zero-filled when asked), freed when destroyed;
//  - copy(dst, src, bytes): dst and src do not overlap;
//  - copy_box: the sub-block `extent` at `src_at` of a row-major `src_shape` block to `dst_at`
//    of a row-major `dst_shape` block, elements of `elem` bytes;
//  - pack_pieces(block, shape, dim, g, packed, elem): the g equal pieces of a row-major block
//    along `dim` (piece j holds elements [j*w, (j+1)*w) of that dim, w = shape[dim] / g), each
//    made contiguous, one after another; unpack_pieces(packed, block, ...) is its inverse. The
//    pack and unpack of an even collective step, in one pass;
//  - fill_identity: every element set to the identity of op (0 for sum and avg);
//  - divide / multiply: every element divided by g / multiplied by g (summed g times);
//  - reduce(dtype, out, parts, count, op): out[i] = parts[0][i] op ... op parts[g-1][i], in
//    order, f16 and bf16 in float, avg divided by g once; out may alias a part.
template <class O>
concept LocalOps = requires(const O& o, void* p, const void* q, std::size_t n, const Shape& s,
                            DType dtype, ReduceOp op, int g, std::span<const void* const> parts) {
  { o.allocate(n, true).data() } -> std::convertible_to<std::byte*>;
  o.copy(p, q, n);
  o.copy_box(q, s, s, p, s, s, s, n);
  o.pack_pieces(q, s, g, g, p, n);
  o.unpack_pieces(q, p, s, g, g, n);
  o.fill_identity(dtype, p, n, op);
  o.divide(dtype, p, n, g);
  o.multiply(dtype, p, n, g);
  o.reduce(dtype, p, parts, n, op);
};

// One copy of many (copy_runs): `rows` runs of `run_bytes`, the r-th from src + r * src_stride
// to dst + r * dst_stride (strides in bytes; one row for a plain copy). No copy overlaps another's
// destination or its own source.
struct RunCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t rows = 1, run_bytes = 0, src_stride = 0, dst_stride = 0;
};

// Runs every copy of `copies`: in one call where the ops provide `copy_runs(copies)` (a device
// launches one kernel for all of them, where a copy each would pay a launch each), else one by
// one with copy() and copy_box().
template <class O>
void copy_runs(const O& ops, std::span<const RunCopy> copies) {
  if constexpr (requires { ops.copy_runs(copies); }) {
    if (!copies.empty()) ops.copy_runs(copies);
  } else {
    for (const RunCopy& c : copies) {
      if (c.rows == 0 || c.run_bytes == 0) continue;
      if (c.rows == 1 || (c.src_stride == c.run_bytes && c.dst_stride == c.run_bytes)) {
        ops.copy(c.dst, c.src, c.rows * c.run_bytes);
        continue;
      }
      // Whole elements of the widest size that every run and address allows.
      std::size_t e = 8;
      while (e > 1 &&
             ((c.run_bytes | c.src_stride | c.dst_stride | reinterpret_cast<std::uintptr_t>(c.src) |
               reinterpret_cast<std::uintptr_t>(c.dst)) &
              (e - 1)) != 0)
        e /= 2;
      const auto rows = static_cast<std::int64_t>(c.rows);
      const auto run = static_cast<std::int64_t>(c.run_bytes / e);
      ops.copy_box(c.src, Shape{rows, static_cast<std::int64_t>(c.src_stride / e)}, Shape{0, 0},
                   c.dst, Shape{rows, static_cast<std::int64_t>(c.dst_stride / e)}, Shape{0, 0},
                   Shape{rows, run}, e);
    }
  }
}

// Local operations on host memory.
struct HostOps {
  // A staging buffer in host memory. Large ones come from, and go back to, this thread's
  // cache of freed blocks (detail::HostBlockCache), so repeated runs reuse mapped memory. With
  // `abandon_if`, a buffer released while *abandon_if holds is abandoned (see abandon()).
  class Buffer {
   public:
    Buffer() = default;
    explicit Buffer(std::size_t n, bool zero, const bool* abandon_if = nullptr)
        : size_(n), abandon_if_(abandon_if) {
      if (n == 0) return;
      bytes_ = n >= detail::HostBlockCache::min_cached_bytes
                   ? detail::host_block_cache().take(n, capacity_)
                   : std::make_unique_for_overwrite<std::byte[]>(n);
      if (capacity_ == 0) capacity_ = n;
      if (zero) std::memset(bytes_.get(), 0, n);
    }
    Buffer(Buffer&& other) noexcept
        : bytes_(std::move(other.bytes_)),
          size_(std::exchange(other.size_, 0)),
          capacity_(std::exchange(other.capacity_, 0)),
          abandon_if_(other.abandon_if_) {}
    Buffer& operator=(Buffer&& other) noexcept {
      if (this != &other) {
        release();
        bytes_ = std::move(other.bytes_);
        size_ = std::exchange(other.size_, 0);
        capacity_ = std::exchange(other.capacity_, 0);
        abandon_if_ = other.abandon_if_;
      }
      return *this;
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { release(); }
    [[nodiscard]] std::byte* data() const noexcept { return bytes_.get(); }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    // Gives the memory up to an operation that may still use it: kept until the process ends,
    // never reused (detail::keep_until_exit). The buffer is empty after.
    void abandon() noexcept {
      if (bytes_) {
        try {
          detail::keep_until_exit(std::move(bytes_));
        } catch (...) {  // out of memory for the record: lose the pointer, never free it
          static_cast<void>(bytes_.release());
        }
      }
      bytes_.reset();
      size_ = capacity_ = 0;
    }

   private:
    void release() noexcept {
      if (abandon_if_ != nullptr && *abandon_if_) return abandon();
      detail::host_block_cache().give(std::move(bytes_), capacity_);
      bytes_.reset();
      size_ = capacity_ = 0;
    }

    std::unique_ptr<std::byte[]> bytes_;
    std::size_t size_ = 0;
    std::size_t capacity_ = 0;
    const bool* abandon_if_ = nullptr;
  };

  // Uninitialised unless `zero`: every byte that matters is written before it is read.
  [[nodiscard]] Buffer allocate(std::size_t bytes, bool zero = false) const {
    return Buffer(bytes, zero);
  }
  void copy(void* dst, const void* src, std::size_t bytes) const {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  void copy_box(const void* src, const Shape& src_shape, const Shape& src_at, void* dst,
                const Shape& dst_shape, const Shape& dst_at, const Shape& extent,
                std::size_t elem) const {
    detail::copy_box(static_cast<const std::byte*>(src), src_shape, src_at,
                     static_cast<std::byte*>(dst), dst_shape, dst_at, extent, elem);
  }
  void pack_pieces(const void* block, const Shape& shape, int dim, int g, void* packed,
                   std::size_t elem) const {
    move_pieces(block, packed, shape, dim, g, elem, true);
  }
  void unpack_pieces(const void* packed, void* block, const Shape& shape, int dim, int g,
                     std::size_t elem) const {
    move_pieces(packed, block, shape, dim, g, elem, false);
  }
  void fill_identity(DType dtype, void* data, std::size_t count, ReduceOp op) const {
    detail::visit_dtype(
        dtype, [&]<class T>() { detail::fill_identity(static_cast<T*>(data), count, op); });
  }
  // The block of shape `inner` that starts at `data` moved in place to `at` inside the block of
  // shape `outer` that `data` then holds, every other element set to op's identity: a fill
  // (S(i) -> P(op)) whose block before lies in its target. Optional (a backend's ops without it
  // fill into another buffer).
  void fill_around_in_place(DType dtype, void* data, const Shape& inner, const Shape& outer,
                            const Shape& at, ReduceOp op) const {
    detail::visit_dtype(dtype, [&]<class T>() {
      detail::expand_box_in_place(static_cast<std::byte*>(data), inner, outer, at, sizeof(T),
                                  [op](std::byte* run, std::int64_t count) {
                                    detail::fill_identity(static_cast<T*>(static_cast<void*>(run)),
                                                          static_cast<std::size_t>(count), op);
                                  });
    });
  }
  void divide(DType dtype, void* data, std::size_t count, int g) const {
    detail::visit_dtype(dtype, [&]<class T>() { detail::divide(static_cast<T*>(data), count, g); });
  }
  void multiply(DType dtype, void* data, std::size_t count, int g) const {
    detail::visit_dtype(dtype,
                        [&]<class T>() { detail::multiply_by(static_cast<T*>(data), count, g); });
  }
  void reduce(DType dtype, void* out, std::span<const void* const> parts, std::size_t count,
              ReduceOp op) const {
    detail::visit_dtype(dtype, [&]<class T>() {
      constexpr std::size_t on_stack = 64;
      const T* small[on_stack] = {};
      std::unique_ptr<const T*[]> large;
      const T** in = small;
      if (parts.size() > on_stack) {
        large = std::make_unique<const T*[]>(parts.size());
        in = large.get();
      }
      for (std::size_t j = 0; j < parts.size(); ++j) in[j] = static_cast<const T*>(parts[j]);
      detail::reduce_into(static_cast<T*>(out), in, static_cast<int>(parts.size()), count, op);
    });
  }
  // reduce(), with part `strided` read where it lies, `rows` runs of `run_bytes` from `at`,
  // `stride_bytes` apart (parts[strided] is ignored); `out` and the other parts hold the runs
  // one after another. Same operations in the same order as reduce() on the packed part. Runs
  // shorter than 64 KB are gathered a 64 KB tile at a time (tiles of fewer bytes ran up to 1.7x
  // slower here than copying the whole part first), so that each pass reduces many runs.
  void reduce_with_strided_part(DType dtype, void* out, std::span<const void* const> parts,
                                std::size_t strided, const void* at, std::size_t rows,
                                std::size_t run_bytes, std::size_t stride_bytes,
                                ReduceOp op) const {
    detail::visit_dtype(dtype, [&]<class T>() {
      constexpr std::size_t tile = (std::size_t{64} << 10) / sizeof(T);  // elements
      std::vector<const T*> in(parts.size());
      const std::size_t run = run_bytes / sizeof(T);
      const auto* from = static_cast<const std::byte*>(at);
      const std::size_t per_pass = run >= tile || run == 0 ? 1 : tile / run;
      std::vector<T> gathered(per_pass > 1 ? std::min(per_pass, rows) * run : 0);
      for (std::size_t r = 0; r < rows; r += per_pass) {
        const std::size_t n = rows - r < per_pass ? rows - r : per_pass;
        const T* own = nullptr;
        if (per_pass == 1) {
          own = static_cast<const T*>(static_cast<const void*>(from + r * stride_bytes));
        } else {
          for (std::size_t i = 0; i < n; ++i)
            std::memcpy(gathered.data() + i * run, from + (r + i) * stride_bytes, run_bytes);
          own = gathered.data();
        }
        for (std::size_t j = 0; j < parts.size(); ++j)
          in[j] = j == strided ? own : static_cast<const T*>(parts[j]) + r * run;
        detail::reduce_into(static_cast<T*>(out) + r * run, in.data(),
                            static_cast<int>(parts.size()), n * run, op);
      }
    });
  }

 private:
  // Block to packed pieces when `pack`, packed pieces to block otherwise.
  void move_pieces(const void* src, void* dst, const Shape& shape, int dim, int g, std::size_t elem,
                   bool pack) const {
    Shape piece = shape;
    piece[dim] /= g;
    std::size_t piece_bytes = elem;
    for (std::int64_t e : piece) piece_bytes *= static_cast<std::size_t>(e);
    Shape at(shape.size(), 0);
    const Shape origin(shape.size(), 0);
    for (int j = 0; j < g; ++j, at[dim] += piece[dim]) {
      const std::size_t packed_at = static_cast<std::size_t>(j) * piece_bytes;
      if (pack)
        copy_box(src, shape, at, static_cast<std::byte*>(dst) + packed_at, piece, origin, piece,
                 elem);
      else
        copy_box(static_cast<const std::byte*>(src) + packed_at, piece, origin, dst, shape, at,
                 piece, elem);
    }
  }
};

static_assert(LocalOps<HostOps>);

}  // namespace dtensor
