#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../layout.hpp"

// A block moved in place into a larger block around it: a fill (S(i) -> P(op)) whose block lies
// at the start of its target. On the host, one row after another from the last back; on a
// device, in launches whose every element is written after all reads of its place
// (expand_moves).
namespace dtensor::detail {

// Where the rows of a row-major block `inner` go when it moves in place to `at` inside the
// row-major block `outer` that then holds it. Outer's dims from k on (the trailing dims whole in
// both, merged with k) make rows of `row` elements; inner's row s (of `rows`) is a run of `run`
// elements at s * run before the move and at to(s) after it. Plain arrays, no heap: a kernel
// argument as it is.
struct ExpandGeometry {
  int k = 0;                // dims before k index rows
  std::int64_t rows = 0;    // inner's rows: 0 where nothing moves (inner or outer empty, 0-d)
  std::int64_t row = 0;     // elements of one row of outer
  std::int64_t run = 0;     // elements of one row of inner
  std::int64_t run_at = 0;  // where inner's part of a row starts in it
  std::int64_t inner_count = 0, outer_count = 0;
  std::int64_t inner_extent[max_tensor_dims] = {};  // inner's dims before k
  std::int64_t outer_extent[max_tensor_dims] = {};  // outer's dims before k
  std::int64_t at[max_tensor_dims] = {};            // where inner starts along them

  // The row of outer that holds inner's row s.
  [[nodiscard]] constexpr std::int64_t row_of(std::int64_t s) const noexcept {
    std::int64_t q = 0, scale = 1;
    for (int d = k - 1; d >= 0; --d) {
      q += (s % inner_extent[d] + at[d]) * scale;
      s /= inner_extent[d];
      scale *= outer_extent[d];
    }
    return q;
  }
  // Where inner's row s starts once moved, in elements of outer.
  [[nodiscard]] constexpr std::int64_t to(std::int64_t s) const noexcept {
    return row_of(s) * row + run_at;
  }
  // Whether element i of outer lies in the moved block.
  [[nodiscard]] constexpr bool holds(std::int64_t i) const noexcept {
    if (rows == 0) return inner_count != 0;
    std::int64_t q = i / row;
    const std::int64_t c = i - q * row;
    if (c < run_at || c >= run_at + run) return false;
    for (int d = k - 1; d >= 0; --d) {
      const std::int64_t at_d = q % outer_extent[d] - at[d];
      if (at_d < 0 || at_d >= inner_extent[d]) return false;
      q /= outer_extent[d];
    }
    return true;
  }
};

// ExpandGeometry of `inner` moved to `at` inside `outer` (inner lies inside it).
constexpr ExpandGeometry expand_geometry(const Shape& inner, const Shape& outer, const Shape& at) {
  ExpandGeometry g;
  const int nd = static_cast<int>(outer.size());
  g.inner_count = g.outer_count = 1;
  for (int d = 0; d < nd; ++d) g.outer_count *= outer[d], g.inner_count *= inner[d];
  if (nd == 0 || g.inner_count == 0 || g.outer_count == 0) return g;
  int k = nd - 1;
  while (k > 0 && inner[k] == outer[k] && at[k] == 0) --k;
  std::int64_t tail = 1;
  for (int d = k + 1; d < nd; ++d) tail *= outer[d];
  g.k = k;
  g.row = outer[k] * tail;
  g.run = inner[k] * tail;
  g.run_at = at[k] * tail;
  g.rows = g.inner_count / g.run;
  for (int d = 0; d < k; ++d) {
    g.inner_extent[d] = inner[d];
    g.outer_extent[d] = outer[d];
    g.at[d] = at[d];
  }
  return g;
}

// One launch of a move in place: elements [from, to) of each of inner's rows [first, last),
// each to its place (ExpandGeometry::to).
struct ExpandMove {
  std::int64_t first = 0, last = 0;
  std::int64_t from = 0, to = 0;
};

// Calls emit(ExpandMove) for the moves that put inner's rows in their places, in order, such
// that no element a move writes is read by it or a later one, so every element of a move may be
// copied at once. A row's place is no lower than its start and rises at least a row of outer a
// row, so the rows go from the last back: all rows whose places lie past the start of every
// row not yet moved in one move (the moves shrink geometrically where outer is larger by a
// constant factor), and a row whose place overlaps its own start in pieces of the gap from its
// end. Rows already in place (a gap of 0, and every row before) are not moved.
template <class Emit>
constexpr void expand_moves(const ExpandGeometry& g, Emit&& emit) {
  std::int64_t end = g.rows;  // rows [0, end) not yet moved
  while (end > 0) {
    const std::int64_t last = end - 1;
    const std::int64_t gap = g.to(last) - last * g.run;
    if (gap == 0) return;
    if (gap < g.run) {
      for (std::int64_t e = g.run; e > 0; e -= gap)
        emit(ExpandMove{last, end, e > gap ? e - gap : 0, e});
      end = last;
      continue;
    }
    // The first row whose place (and every later one's) lies past the end of rows [0, end).
    std::int64_t lo = 0, hi = last;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (g.to(mid) >= end * g.run)
        hi = mid;
      else
        lo = mid + 1;
    }
    emit(ExpandMove{lo, end, 0, g.run});
    end = lo;
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
  const ExpandGeometry g = expand_geometry(inner, outer, at);
  if (g.outer_count == 0) return;
  if (g.rows == 0) {
    if (g.inner_count == 0) fill(data, g.outer_count);
    return;
  }
  const auto bytes = [elem](std::int64_t n) { return static_cast<std::size_t>(n) * elem; };
  std::int64_t s = g.rows;  // inner's rows not yet moved
  for (std::int64_t q = g.outer_count / g.row; q-- > 0;) {
    std::byte* out = data + bytes(q * g.row);
    if (s == 0 || g.row_of(s - 1) != q) {
      fill(out, g.row);
      continue;
    }
    --s;
    std::memmove(out + bytes(g.run_at), data + bytes(s * g.run), bytes(g.run));
    if (g.run_at > 0) fill(out, g.run_at);
    if (g.run_at + g.run < g.row) fill(out + bytes(g.run_at + g.run), g.row - g.run_at - g.run);
  }
}

}  // namespace dtensor::detail
