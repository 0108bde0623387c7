#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../layout.hpp"

// Copies of rectangular sub-blocks between row-major buffers on the host: the pack and unpack
// of every step (an all-gather along a non-leading dim is a block transpose).
namespace dtensor::detail {

// Copies the sub-block of size `extent` at `src_at` inside a row-major `src` of shape
// `src_shape` to `dst_at` inside a row-major `dst` of shape `dst_shape`; elements of
// `elem` bytes.
inline void copy_box(const std::byte* src, const Shape& src_shape, const Shape& src_at,
                     std::byte* dst, const Shape& dst_shape, const Shape& dst_at,
                     const Shape& extent, std::size_t elem) {
  const int nd = static_cast<int>(extent.size());
  for (int d = 0; d < nd; ++d)
    if (extent[d] == 0) return;
  if (nd == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  // Strides in elements.
  std::int64_t src_stride[max_tensor_dims], dst_stride[max_tensor_dims];
  src_stride[nd - 1] = dst_stride[nd - 1] = 1;
  for (int d = nd - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src_shape[d];
    dst_stride[d - 1] = dst_stride[d] * dst_shape[d];
  }
  // Merge the trailing dims that are whole in both buffers into one contiguous run.
  int inner = nd - 1;
  std::int64_t run = extent[nd - 1];
  while (inner > 0 && extent[inner] == src_shape[inner] && extent[inner] == dst_shape[inner] &&
         src_at[inner] == 0 && dst_at[inner] == 0) {
    --inner;
    run *= extent[inner];
  }
  std::int64_t src_base = 0, dst_base = 0;
  for (int d = 0; d < nd; ++d) {
    src_base += src_at[d] * src_stride[d];
    dst_base += dst_at[d] * dst_stride[d];
  }
  std::int64_t index[max_tensor_dims] = {};
  const std::size_t run_bytes = static_cast<std::size_t>(run) * elem;
  while (true) {
    std::int64_t s = src_base, t = dst_base;
    for (int d = 0; d < inner; ++d) s += index[d] * src_stride[d], t += index[d] * dst_stride[d];
    std::memcpy(dst + t * static_cast<std::int64_t>(elem),
                src + s * static_cast<std::int64_t>(elem), run_bytes);
    int d = inner - 1;
    for (; d >= 0; --d) {
      if (++index[d] < extent[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace dtensor::detail
