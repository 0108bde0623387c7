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

// Moves the row-major block of shape `inner` that starts at `data` to `at` inside the row-major
// block of shape `outer` that `data` then holds (inner lies inside it), in place, and calls
// `fill(run, count)` on every run of `count` elements of outer outside it. Every element moves
// to an offset no lower than its own, and a row of outer is written only once every element
// that lies there has moved: so the rows go from the last back.
template <class Fill>
void expand_box_in_place(std::byte* data, const Shape& inner, const Shape& outer, const Shape& at,
                         std::size_t elem, Fill&& fill) {
  const int nd = static_cast<int>(outer.size());
  std::int64_t outer_count = 1, inner_count = 1;
  for (int d = 0; d < nd; ++d) outer_count *= outer[d], inner_count *= inner[d];
  if (outer_count == 0) return;
  if (inner_count == 0 || nd == 0) {
    if (inner_count == 0) fill(data, outer_count);
    return;
  }
  // Rows of outer over its dims from `k` on (the trailing dims whole in both merged into them);
  // in each row that holds part of inner, `run` elements from `run_at`.
  int k = nd - 1;
  while (k > 0 && inner[k] == outer[k] && at[k] == 0) --k;
  std::int64_t tail = 1;
  for (int d = k + 1; d < nd; ++d) tail *= outer[d];
  const std::int64_t row = outer[k] * tail, run = inner[k] * tail, run_at = at[k] * tail;
  const auto bytes = [elem](std::int64_t n) { return static_cast<std::size_t>(n) * elem; };
  for (std::int64_t q = outer_count / row; q-- > 0;) {
    std::byte* out = data + bytes(q * row);
    // q's index over outer's dims before k, and the row of inner it holds (if any).
    std::int64_t rest = q, source = 0, scale = 1;
    bool inside = true;
    for (int d = k - 1; d >= 0 && inside; --d) {
      const std::int64_t i = rest % outer[d] - at[d];
      rest /= outer[d];
      inside = i >= 0 && i < inner[d];
      source += i * scale;
      scale *= inner[d];
    }
    if (!inside) {
      fill(out, row);
      continue;
    }
    std::memmove(out + bytes(run_at), data + bytes(source * run), bytes(run));
    if (run_at > 0) fill(out, run_at);
    if (run_at + run < row) fill(out + bytes(run_at + run), row - run_at - run);
  }
}

}  // namespace dtensor::detail
