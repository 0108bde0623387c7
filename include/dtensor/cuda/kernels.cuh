#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "../config.hpp"
#include "../detail/elementwise.hpp"
#include "../dtype.hpp"
#include "../errors.hpp"
#include "../layout.hpp"
#include "../local_ops.hpp"
#include "../reduce_op.hpp"
#include "check.hpp"

// The device side of a plan's local work, as templates: strided block copies (the pack and
// unpack of every step, with vectorised loads and stores), fills, scaling and ordered
// reductions for every dtype. Each function enqueues on `stream` and returns at once. The
// element-level arithmetic is the host's own (detail/elementwise.hpp), so device and host
// results are bit-identical. Needs nvcc with --expt-relaxed-constexpr (set by dtensor::nccl).
namespace dtensor::cuda {

// The most inputs one reduce() combines.
inline constexpr int max_reduce_parts = 256;

namespace detail {

using dtensor::detail::compute_t;

// n / d for 32-bit n < 2^31 by multiply-high and shift, without the hardware divide.
struct FastDivider {
  std::uint64_t divisor = 1;
  std::uint32_t magic = 0, shift = 0;

  FastDivider() = default;
  explicit FastDivider(std::uint64_t d) : divisor(d) {
    while (shift < 32 && (std::uint32_t{1} << shift) < d) ++shift;
    const std::uint64_t one = 1;
    if (shift < 32)
      magic = static_cast<std::uint32_t>(((one << 32) * ((one << shift) - d)) / d + 1);
  }
  __device__ std::uint32_t divide(std::uint32_t n) const {
    const std::uint32_t t = __umulhi(n, magic);
    return (t + n) >> shift;
  }
};

// A strided copy reduced to its simplest form: `dims` outer dims (outermost first) of rows,
// each row `run` vector units long and contiguous in both buffers. Strides in vector units.
template <class I>
struct BoxCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  int dims = 0;
  I extent[max_tensor_dims + 1] = {};
  I src_stride[max_tensor_dims + 1] = {};
  I dst_stride[max_tensor_dims + 1] = {};
  FastDivider extent_div[max_tensor_dims + 1];
  FastDivider run_div;
  I run = 1;
  I total = 0;
};

template <class I>
__device__ I divide(const FastDivider& d, I n) {
  if constexpr (sizeof(I) == 4)
    return d.divide(n);
  else
    return n / d.divisor;
}

template <class V, class I>
__global__ void copy_box_kernel(BoxCopy<I> a) {
  const V* src = static_cast<const V*>(a.src);
  V* dst = static_cast<V*>(a.dst);
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I u = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; u < a.total; u += step) {
    I row = divide(a.run_div, u);
    const I col = u - row * a.run;
    I s = col, t = col;
    for (int d = a.dims - 1; d > 0; --d) {
      const I q = divide(a.extent_div[d], row);
      const I i = row - q * a.extent[d];
      s += i * a.src_stride[d];
      t += i * a.dst_stride[d];
      row = q;
    }
    s += row * a.src_stride[0];
    t += row * a.dst_stride[0];
    dst[t] = src[s];
  }
}

template <class T>
__global__ void fill_kernel(T* data, std::size_t count, T value) {
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step)
    data[i] = value;
}

// Move m of a block moved in place (dtensor::detail::expand_moves): elements [m.from, m.to) of
// rows [m.first, m.last), each to its place. No element written here is read here or later, so
// every thread copies without order.
template <class V>
__global__ void expand_move_kernel(V* data, dtensor::detail::ExpandGeometry g,
                                   dtensor::detail::ExpandMove m) {
  const std::int64_t width = m.to - m.from, total = (m.last - m.first) * width;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < total;
       u += step) {
    const std::int64_t s = m.first + u / width, j = m.from + u % width;
    data[g.to(s) + j] = data[s * g.run + j];
  }
}

// Every element of the outer block that the moved block does not hold set to `value`.
template <class T>
__global__ void fill_around_kernel(T* data, dtensor::detail::ExpandGeometry g, T value) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < g.outer_count; i += step)
    if (!g.holds(i)) data[i] = value;
}

template <class T>
__global__ void divide_kernel(T* data, std::size_t count, int g) {
  using C = compute_t<T>;
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step)
    data[i] = dtensor::detail::narrow<T>(static_cast<C>(dtensor::detail::widen(data[i]) / C(g)));
}

template <class T>
__global__ void multiply_kernel(T* data, std::size_t count, int g) {
  using C = compute_t<T>;
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    C acc = C(0);
    for (int j = 0; j < g; ++j) acc = dtensor::detail::add(acc, dtensor::detail::widen(data[i]));
    data[i] = dtensor::detail::narrow<T>(acc);
  }
}

template <class T>
struct ReduceParts {
  const T* part[max_reduce_parts];
};

template <class T>
__global__ void reduce_kernel(T* out, ReduceParts<T> in, int parts, std::size_t count,
                              ReduceOp op) {
  using C = compute_t<T>;
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    C acc = dtensor::detail::widen(in.part[0][i]);
    for (int p = 1; p < parts; ++p)
      acc = dtensor::detail::combine(acc, dtensor::detail::widen(in.part[p][i]), op);
    if (op == ReduceOp::avg) acc = static_cast<C>(acc / static_cast<C>(parts));
    out[i] = dtensor::detail::narrow<T>(acc);
  }
}

// Blocks for a grid-stride loop over n items: enough to fill the device, no more.
inline unsigned grid_for(std::uint64_t n, unsigned threads) {
  static const int sms = [] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      return 80;
    return count;
  }();
  const std::uint64_t wanted = (n + threads - 1) / threads;
  const std::uint64_t most = static_cast<std::uint64_t>(sms) * (2048 / threads);
  return static_cast<unsigned>(std::max<std::uint64_t>(1, std::min(wanted, most)));
}

template <class V, class I>
void launch_copy_box(const BoxCopy<I>& a, cudaStream_t stream) {
  constexpr unsigned threads = 256;
  copy_box_kernel<V, I>
      <<<grid_for(static_cast<std::uint64_t>(a.total), threads), threads, 0, stream>>>(a);
  check(cudaGetLastError(), "copy_box kernel launch");
}

// Copies per launch of copy_runs (their descriptors are the kernel's argument: 12 KB, within
// the 32 KB that CUDA 12.1 and later allow on Volta and later).
inline constexpr int runs_per_launch = 256;

struct RunCopies {
  RunCopy copy[runs_per_launch];
};

// Copy c of `runs` in vector units V: every thread of the block's x-dim strides over its units.
template <class V>
__device__ void copy_runs_as(const RunCopy& c) {
  const V* src = static_cast<const V*>(c.src);
  V* dst = static_cast<V*>(c.dst);
  const std::size_t run = c.run_bytes / sizeof(V);
  const std::size_t total = c.rows * run;
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t u = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c.rows == 1) {
    for (; u < total; u += step) dst[u] = src[u];
    return;
  }
  const std::size_t src_stride = c.src_stride / sizeof(V), dst_stride = c.dst_stride / sizeof(V);
  for (; u < total; u += step) {
    const std::size_t row = u / run, col = u - row * run;
    dst[row * dst_stride + col] = src[row * src_stride + col];
  }
}

// blockIdx.y picks the copy; each copy goes in the widest units its runs and addresses allow.
__global__ inline void copy_runs_kernel(RunCopies runs) {
  const RunCopy& c = runs.copy[blockIdx.y];
  std::uintptr_t a = reinterpret_cast<std::uintptr_t>(c.src) |
                     reinterpret_cast<std::uintptr_t>(c.dst) | c.run_bytes;
  if (c.rows > 1) a |= c.src_stride | c.dst_stride;
  if (a % 16 == 0)
    copy_runs_as<uint4>(c);
  else if (a % 8 == 0)
    copy_runs_as<std::uint64_t>(c);
  else if (a % 4 == 0)
    copy_runs_as<std::uint32_t>(c);
  else if (a % 2 == 0)
    copy_runs_as<std::uint16_t>(c);
  else
    copy_runs_as<std::uint8_t>(c);
}

}  // namespace detail

// Every copy of `copies` (device memory), runs_per_launch to a kernel launch on `stream`: the
// local work of a batch's round, where a launch per copy would cost more than the copies.
inline void copy_runs(std::span<const RunCopy> copies, cudaStream_t stream) {
  constexpr unsigned threads = 256;
  for (std::size_t first = 0; first < copies.size(); first += detail::runs_per_launch) {
    const std::size_t n = std::min<std::size_t>(copies.size() - first, detail::runs_per_launch);
    detail::RunCopies runs;
    std::uint64_t largest = 0;
    for (std::size_t i = 0; i < n; ++i) {
      runs.copy[i] = copies[first + i];
      largest =
          std::max<std::uint64_t>(largest, copies[first + i].rows * copies[first + i].run_bytes);
    }
    if (largest == 0) continue;
    // Blocks along x: what the largest copy needs at 16 bytes a thread, and no more than what
    // fills the device once shared among the launch's copies.
    const unsigned fill = detail::grid_for(std::uint64_t{1} << 62, threads);
    const unsigned x = std::min(detail::grid_for(largest / 16 + 1, threads),
                                std::max(1u, fill / static_cast<unsigned>(n)));
    detail::copy_runs_kernel<<<dim3(x, static_cast<unsigned>(n)), threads, 0, stream>>>(runs);
    check(cudaGetLastError(), "copy_runs kernel launch");
  }
}

// The order a strided copy walks its dims in: that of the destination buffer (consecutive
// threads then write consecutive addresses), or the order given.
enum class Walk { destination, as_given };

// Copies `nd` nested dims of elements of `elem` bytes: element (i_0, ..., i_{nd-1}) at
// src + sum(i_d * src_stride[d]) goes to dst + sum(i_d * dst_stride[d]) (strides in elements,
// device memory), on `stream`. Dims are visited in the order `walk` says; dims
// contiguous in both buffers merge; a fully contiguous copy goes to cudaMemcpyAsync, the rest to
// one kernel launch with the widest vector loads and stores (up to 16 bytes) that the alignment
// of rows and buffers allows.
inline void copy_strided(const void* src, void* dst, int nd, const std::int64_t* extent,
                         const std::int64_t* src_stride, const std::int64_t* dst_stride,
                         std::size_t elem, cudaStream_t stream, Walk walk = Walk::destination) {
  for (int d = 0; d < nd; ++d)
    if (extent[d] == 0) return;
  // Byte strides of the dims that are not 1 wide, outermost (largest destination stride) first.
  struct Dim {
    std::int64_t extent, src, dst;
  };
  Dim dims[max_tensor_dims + 2];
  int n = 0;
  const auto e = static_cast<std::int64_t>(elem);
  for (int d = 0; d < nd; ++d)
    if (extent[d] != 1) dims[n++] = {extent[d], src_stride[d] * e, dst_stride[d] * e};
  if (walk == Walk::destination)
    std::stable_sort(dims, dims + n, [](const Dim& x, const Dim& y) { return x.dst > y.dst; });
  // Merge a dim into the one outside it where both buffers step over it contiguously.
  int m = 0;
  for (int d = 0; d < n; ++d) {
    if (m > 0 && dims[m - 1].src == dims[d].extent * dims[d].src &&
        dims[m - 1].dst == dims[d].extent * dims[d].dst) {
      dims[m - 1] = {dims[m - 1].extent * dims[d].extent, dims[d].src, dims[d].dst};
      continue;
    }
    dims[m++] = dims[d];
  }
  n = m;
  // The contiguous innermost run, in bytes: the last dim when it is dense in both, else one
  // element.
  std::int64_t run = e;
  if (n > 0 && dims[n - 1].src == e && dims[n - 1].dst == e) {
    run = dims[n - 1].extent * e;
    --n;
  }
  if (n == 0) {
    check(
        cudaMemcpyAsync(dst, src, static_cast<std::size_t>(run), cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync");
    return;
  }
  // The widest vector that divides the run, every stride and both base addresses.
  auto alignment = static_cast<std::uint64_t>(run) | reinterpret_cast<std::uintptr_t>(src) |
                   reinterpret_cast<std::uintptr_t>(dst);
  for (int d = 0; d < n; ++d)
    alignment |= static_cast<std::uint64_t>(dims[d].src) | static_cast<std::uint64_t>(dims[d].dst);
  std::int64_t width = 16;
  while (alignment % static_cast<std::uint64_t>(width) != 0) width /= 2;
  std::int64_t rows = 1;
  for (int d = 0; d < n; ++d) rows *= dims[d].extent;
  const std::int64_t total = rows * (run / width);
  auto launch = [&]<class I>() {
    detail::BoxCopy<I> a;
    a.src = src;
    a.dst = dst;
    a.dims = n;
    for (int d = 0; d < n; ++d) {
      a.extent[d] = static_cast<I>(dims[d].extent);
      a.src_stride[d] = static_cast<I>(dims[d].src / width);
      a.dst_stride[d] = static_cast<I>(dims[d].dst / width);
      a.extent_div[d] = detail::FastDivider(static_cast<std::uint64_t>(dims[d].extent));
    }
    a.run = static_cast<I>(run / width);
    a.run_div = detail::FastDivider(static_cast<std::uint64_t>(a.run));
    a.total = static_cast<I>(total);
    switch (width) {
      case 16: detail::launch_copy_box<uint4, I>(a, stream); break;
      case 8: detail::launch_copy_box<uint2, I>(a, stream); break;
      case 4: detail::launch_copy_box<std::uint32_t, I>(a, stream); break;
      case 2: detail::launch_copy_box<std::uint16_t, I>(a, stream); break;
      default: detail::launch_copy_box<std::uint8_t, I>(a, stream); break;
    }
  };
  // 32-bit indices (and divisions by multiplication) wherever every offset fits in 2^31.
  std::int64_t span_units = total;
  for (int d = 0; d < n; ++d)
    span_units = std::max({span_units, dims[d].extent * (dims[d].src / width),
                           dims[d].extent * (dims[d].dst / width)});
  if (span_units < (std::int64_t{1} << 31))
    launch.template operator()<std::uint32_t>();
  else
    launch.template operator()<std::uint64_t>();
}

namespace detail {

// Row-major strides, in elements, of `shape`.
inline void row_major_strides(const Shape& shape, std::int64_t* stride) {
  std::int64_t s = 1;
  for (int d = static_cast<int>(shape.size()); d-- > 0;) {
    stride[d] = s;
    s *= shape[d];
  }
}

// The dims of "the g equal pieces of a `shape` block along `dim`, one after another": extents
// (g first, then the piece's dims), and the strides of that walk in the block and in the
// packed pieces.
inline int pieces_walk(const Shape& shape, int dim, int g, std::int64_t* extent,
                       std::int64_t* block_stride, std::int64_t* packed_stride) {
  const int nd = static_cast<int>(shape.size());
  Shape piece = shape;
  piece[dim] /= g;
  std::int64_t block[max_tensor_dims], packed[max_tensor_dims];
  row_major_strides(shape, block);
  row_major_strides(piece, packed);
  extent[0] = g;
  block_stride[0] = block[dim] * piece[dim];
  packed_stride[0] = piece.empty() ? 1 : packed[0] * piece[0];
  for (int d = 0; d < nd; ++d) {
    extent[d + 1] = piece[d];
    block_stride[d + 1] = block[d];
    packed_stride[d + 1] = packed[d];
  }
  return nd + 1;
}

}  // namespace detail

// Copies the sub-block `extent` at `src_at` of a row-major `src` of shape `src_shape` to `dst_at`
// of a row-major `dst` of shape `dst_shape` (device memory, elements of `elem` bytes), on
// `stream`: one copy_strided.
inline void copy_box(const void* src, const Shape& src_shape, const Shape& src_at, void* dst,
                     const Shape& dst_shape, const Shape& dst_at, const Shape& extent,
                     std::size_t elem, cudaStream_t stream) {
  const int nd = static_cast<int>(extent.size());
  std::int64_t s[max_tensor_dims], d[max_tensor_dims];
  detail::row_major_strides(src_shape, s);
  detail::row_major_strides(dst_shape, d);
  std::int64_t src_base = 0, dst_base = 0, ext[max_tensor_dims];
  for (int k = 0; k < nd; ++k) {
    src_base += src_at[k] * s[k];
    dst_base += dst_at[k] * d[k];
    ext[k] = extent[k];
  }
  const auto e = static_cast<std::int64_t>(elem);
  copy_strided(static_cast<const std::byte*>(src) + src_base * e,
               static_cast<std::byte*>(dst) + dst_base * e, nd, ext, s, d, elem, stream);
}

namespace detail {

// A pack of pieces whose rows (the contiguous part of a piece between two of its rows) are
// shorter than this, from a block larger than the L2 cache, goes in tiles of rows: a tile holds
// a few rows of every piece, so that its scattered reads stay within a small span of memory.
// (Smaller blocks stay in L2 whatever the order; unpacks measured best in the block's order.)
inline constexpr std::int64_t narrow_row_bytes = 512;
inline constexpr std::int64_t tile_bytes = 64 * 1024;

// The current device's L2 cache size in bytes (read once).
inline std::int64_t l2_bytes() {
  static const std::int64_t bytes = [] {
    int device = 0, size = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&size, cudaDevAttrL2CacheSize, device) != cudaSuccess)
      return std::int64_t{50} << 20;
    return static_cast<std::int64_t>(size);
  }();
  return bytes;
}

// The copy between a block and its g packed pieces along `dim`: block to pieces when `pack`,
// pieces to block otherwise. `src` and `dst` are the buffers in that direction.
inline void move_pieces(const void* src, void* dst, const Shape& shape, int dim, int g,
                        std::size_t elem, cudaStream_t stream, bool pack) {
  const int nd = static_cast<int>(shape.size());
  std::int64_t rows = 1, inner = 1;
  for (int d = 0; d < dim; ++d) rows *= shape[d];
  for (int d = dim + 1; d < nd; ++d) inner *= shape[d];
  const std::int64_t row = shape[dim] * inner;  // a block row, in elements
  const std::int64_t run = row / g;             // a piece row
  const auto e = static_cast<std::int64_t>(elem);
  const std::int64_t tile_rows = std::max<std::int64_t>(1, tile_bytes / (row * e));
  // Copies `n` dims given with their strides in the block and in the packed pieces, starting
  // at block row `first`.
  auto move = [&](std::int64_t first, int n, const std::int64_t* extent, const std::int64_t* bs,
                  const std::int64_t* ps, Walk walk) {
    const std::int64_t block_at = first * row * e, packed_at = first * run * e;
    copy_strided(static_cast<const std::byte*>(src) + (pack ? block_at : packed_at),
                 static_cast<std::byte*>(dst) + (pack ? packed_at : block_at), n, extent,
                 pack ? bs : ps, pack ? ps : bs, elem, stream, walk);
  };
  if (!pack || run * e >= narrow_row_bytes || rows * row * e <= l2_bytes() ||
      rows < 2 * tile_rows) {
    std::int64_t extent[max_tensor_dims + 1], bs[max_tensor_dims + 1], ps[max_tensor_dims + 1];
    const int n = pieces_walk(shape, dim, g, extent, bs, ps);
    move(0, n, extent, bs, ps, Walk::destination);
    return;
  }
  // Tiles of tile_rows rows, every piece's part of a tile one after another; then the rest.
  const std::int64_t tiles = rows / tile_rows, rest = rows - tiles * tile_rows;
  const std::int64_t piece = rows * run;
  {
    const std::int64_t extent[] = {tiles, g, tile_rows, run};
    const std::int64_t bs[] = {tile_rows * row, run, row, 1};
    const std::int64_t ps[] = {tile_rows * run, piece, run, 1};
    move(0, 4, extent, bs, ps, Walk::as_given);
  }
  if (rest > 0) {
    const std::int64_t extent[] = {g, rest, run};
    const std::int64_t bs[] = {run, row, 1};
    const std::int64_t ps[] = {piece, run, 1};
    move(tiles * tile_rows, 3, extent, bs, ps, Walk::as_given);
  }
}

}  // namespace detail

// Packs the g equal pieces of a row-major `shape` block along `dim` one after another (piece j
// = elements [j*w, (j+1)*w) of that dim, w = shape[dim] / g): one launch (two where a large
// block's narrow rows go in tiles and do not divide into them).
inline void pack_pieces(const void* block, const Shape& shape, int dim, int g, void* packed,
                        std::size_t elem, cudaStream_t stream) {
  detail::move_pieces(block, packed, shape, dim, g, elem, stream, true);
}

// The inverse of pack_pieces: g packed pieces laid side by side along `dim` of the block.
inline void unpack_pieces(const void* packed, void* block, const Shape& shape, int dim, int g,
                          std::size_t elem, cudaStream_t stream) {
  detail::move_pieces(packed, block, shape, dim, g, elem, stream, false);
}

// Sets `count` elements of `dtype` to the identity of `op`.
inline void fill_identity(DType dtype, void* data, std::size_t count, ReduceOp op,
                          cudaStream_t stream) {
  if (count == 0) return;
  dtensor::detail::visit_dtype(dtype, [&]<class T>() {
    constexpr unsigned threads = 256;
    detail::fill_kernel<T><<<detail::grid_for(count, threads), threads, 0, stream>>>(
        static_cast<T*>(data), count, dtensor::detail::identity<T>(op));
  });
  check(cudaGetLastError(), "fill_identity kernel launch");
}

// The block of shape `inner` at the start of `data` moved in place to `at` inside the block of
// shape `outer` that `data` then holds, every other element set to op's identity (LocalOps's
// fill_around_in_place): a launch per move of dtensor::detail::expand_moves (about log_g of the
// rows, where the block is one of g pieces of outer), then one for the identity.
inline void fill_around_in_place(DType dtype, void* data, const Shape& inner, const Shape& outer,
                                 const Shape& at, ReduceOp op, cudaStream_t stream) {
  const dtensor::detail::ExpandGeometry g = dtensor::detail::expand_geometry(inner, outer, at);
  if (g.outer_count == 0 || g.inner_count == g.outer_count) return;
  if (g.inner_count == 0) {
    fill_identity(dtype, data, static_cast<std::size_t>(g.outer_count), op, stream);
    return;
  }
  constexpr unsigned threads = 256;
  dtensor::detail::visit_dtype(dtype, [&]<class T>() {
    // Moved as unsigned integers of the element's size: bits, not values.
    using V = std::conditional_t<
        sizeof(T) == 1, std::uint8_t,
        std::conditional_t<sizeof(T) == 2, std::uint16_t,
                           std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
    static_assert(sizeof(V) == sizeof(T));
    dtensor::detail::expand_moves(g, [&](const dtensor::detail::ExpandMove& m) {
      const auto n = static_cast<std::uint64_t>((m.last - m.first) * (m.to - m.from));
      detail::expand_move_kernel<V>
          <<<detail::grid_for(n, threads), threads, 0, stream>>>(static_cast<V*>(data), g, m);
      check(cudaGetLastError(), "fill_around_in_place move kernel launch");
    });
    detail::fill_around_kernel<T>
        <<<detail::grid_for(static_cast<std::uint64_t>(g.outer_count), threads), threads, 0,
           stream>>>(static_cast<T*>(data), g, dtensor::detail::identity<T>(op));
  });
  check(cudaGetLastError(), "fill_around_in_place kernel launch");
}

// Divides `count` elements by g (f16 and bf16 in float).
inline void divide(DType dtype, void* data, std::size_t count, int g, cudaStream_t stream) {
  if (count == 0) return;
  dtensor::detail::visit_dtype(dtype, [&]<class T>() {
    constexpr unsigned threads = 256;
    detail::divide_kernel<T>
        <<<detail::grid_for(count, threads), threads, 0, stream>>>(static_cast<T*>(data), count, g);
  });
  check(cudaGetLastError(), "divide kernel launch");
}

// Multiplies `count` elements by g, as a sum of g copies (integers saturate).
inline void multiply(DType dtype, void* data, std::size_t count, int g, cudaStream_t stream) {
  if (count == 0) return;
  dtensor::detail::visit_dtype(dtype, [&]<class T>() {
    constexpr unsigned threads = 256;
    detail::multiply_kernel<T>
        <<<detail::grid_for(count, threads), threads, 0, stream>>>(static_cast<T*>(data), count, g);
  });
  check(cudaGetLastError(), "multiply kernel launch");
}

// out[i] = parts[0][i] op ... op parts[g-1][i] in order (f16 and bf16 in float, avg divided by
// g once); out may alias a part. At most max_reduce_parts parts.
inline void reduce(DType dtype, void* out, std::span<const void* const> parts, std::size_t count,
                   ReduceOp op, cudaStream_t stream) {
  if (parts.empty() || parts.size() > static_cast<std::size_t>(max_reduce_parts))
    throw error("cuda::reduce combines 1 to " + std::to_string(max_reduce_parts) + " parts, got " +
                std::to_string(parts.size()));
  if (count == 0) return;
  dtensor::detail::visit_dtype(dtype, [&]<class T>() {
    detail::ReduceParts<T> in{};
    for (std::size_t j = 0; j < parts.size(); ++j) in.part[j] = static_cast<const T*>(parts[j]);
    constexpr unsigned threads = 256;
    detail::reduce_kernel<T><<<detail::grid_for(count, threads), threads, 0, stream>>>(
        static_cast<T*>(out), in, static_cast<int>(parts.size()), count, op);
  });
  check(cudaGetLastError(), "reduce kernel launch");
}

}  // namespace dtensor::cuda
