#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "../layout.hpp"
#include "../placement.hpp"
#include "checked.hpp"
#include "partial_exchange.hpp"
#include "static_vector.hpp"

// An exchange from a Partial: a step from placements with Partial(op) on some mesh dims (the
// reduced dims, one op on all) to placements without Partial there, in two point-to-point
// rounds; other Partials may stay as they are, each of their classes exchanging among itself. The
// ranks that differ only on the reduced dims (a group) hold partial values of one block. First
// each member reduces its part of that block (a range of one tensor dim, or where the step says
// so, Step::by_elements, a run of its elements in row-major order, or in the order with another
// tensor dim outermost) from every member's partial of it, in group order, so that groups holding
// the same block compute bit-identical values; then every rank receives the elements of its target
// block from their owners in the group next to it (the one whose coordinates on the source's
// Replicate dims are its own), keeping those it owns. Each group cuts its block so that its busiest
// member receives the fewest elements over both rounds, (g-1)|part| + |target| - |target ∩ part|: a
// member whose target lies in the block owns more of it, up to the balance. Where reducing every
// element once and sending it on costs fewer bytes than collectives that reduce whole blocks,
// this is the plan: (P(sum), S(0)) -> (S(0), S(1)) on 2x2 receives 3/8 of the tensor per rank,
// where an all-to-all and a reduce-scatter receive half.
namespace dtensor::detail {

// The most members of a group in an exchange from a Partial (each group's cut is kept inline).
inline constexpr int max_reducing_group = 64;

// The mesh dims an exchange from `before` to `after` reduces, and their op: every Partial of
// `before`, of one op, where `after` has no Partial. `after` may keep others of `before`'s
// Partials as they are (`kept`): each of their classes (the ranks that share a coordinate there,
// holding one part) reduces and delivers among itself. Mixed Partial ops reduce outermost first,
// so a kept Partial's op must commute with the reduced op where a reduced dim lies inside it
// (a later mesh dim). `dims` is 0 when the step is no such exchange.
struct ReducedPartials {
  unsigned dims = 0;
  unsigned kept = 0;
  ReduceOp op = ReduceOp::sum;
};

constexpr ReducedPartials reduced_partials(const Placements& before,
                                           const Placements& after) noexcept {
  ReducedPartials r;
  for (std::size_t k = 0; k < before.size() && k < after.size(); ++k) {
    if (after[k].is_partial()) {
      if (!(before[k] == after[k])) return {};
      r.kept |= 1u << k;
      continue;
    }
    if (!before[k].is_partial()) continue;
    if (r.dims != 0 && before[k].reduce_op() != r.op) return {};
    r.op = before[k].reduce_op();
    r.dims |= 1u << k;
  }
  if (r.dims == 0) return {};
  for (std::size_t k = 0; k < before.size() && k < after.size(); ++k)
    if ((r.kept >> k & 1u) != 0 && (r.dims >> (k + 1)) != 0 &&
        !ops_commute(before[k].reduce_op(), r.op))
      return {};
  return r;
}

// Whether an exchange from `before` to `after` reduces a Partial (reduced_partials).
constexpr bool exchange_reduces(const Placements& before, const Placements& after) noexcept {
  return reduced_partials(before, after).dims != 0;
}

// The ranks of a group, on the mesh dims `dims` (bits).
constexpr int group_size(const DeviceMesh& mesh, unsigned dims) {
  int g = 1;
  for (int k = 0; k < mesh.ndim(); ++k)
    if ((dims >> k & 1u) != 0) g *= mesh.size(k);
  return g;
}

// Member j of the group of `coord` on the mesh dims `dims`, the last of them fastest.
constexpr MeshCoord group_member(const DeviceMesh& mesh, MeshCoord coord, unsigned dims, int j) {
  for (int k = mesh.ndim() - 1; k >= 0; --k) {
    if ((dims >> k & 1u) == 0) continue;
    coord[k] = j % mesh.size(k);
    j /= mesh.size(k);
  }
  return coord;
}

// The index of `coord` in its group on the mesh dims `dims` (the inverse of group_member).
constexpr int group_index(const DeviceMesh& mesh, const MeshCoord& coord, unsigned dims) {
  int j = 0;
  for (int k = 0; k < mesh.ndim(); ++k)
    if ((dims >> k & 1u) != 0) j = j * mesh.size(k) + coord[k];
  return j;
}

// The boxes of a run of a block's elements in row-major order: at most two per tensor dim but
// the last, one after another in that order, each itself one run of the block.
using RunBoxes = static_vector<Box, std::size_t{2} * max_tensor_dims - 1>;

// `box` with tensor dim `outer` moved in front of the others, which keep their order: the order
// of a block's elements with that dim outermost is the moved block's row-major order.
constexpr Box outer_first(Box box, int outer) {
  for (auto d = static_cast<std::size_t>(outer); d > 0; --d) {
    const std::int64_t offset = box.offset[d], extent = box.shape[d];
    box.offset[d] = box.offset[d - 1];
    box.shape[d] = box.shape[d - 1];
    box.offset[d - 1] = offset;
    box.shape[d - 1] = extent;
  }
  return box;
}

// The inverse of outer_first: dim 0 of `box` back to tensor dim `outer`.
constexpr Box outer_back(Box box, int outer) {
  for (std::size_t d = 0; d < static_cast<std::size_t>(outer); ++d) {
    const std::int64_t offset = box.offset[d], extent = box.shape[d];
    box.offset[d] = box.offset[d + 1];
    box.shape[d] = box.shape[d + 1];
    box.offset[d + 1] = offset;
    box.shape[d + 1] = extent;
  }
  return box;
}

// Appends to `out` the boxes of elements [a, b) of `block` in row-major order: whole indices of
// ever coarser dims up to the first boundary of a coarser one past which the run does not reach,
// then of ever finer dims up to b.
constexpr void row_major_run_boxes(const Box& block, std::int64_t a, std::int64_t b,
                                   RunBoxes& out) {
  if (a >= b) return;
  const int n = static_cast<int>(block.shape.size());
  std::int64_t stride[max_tensor_dims] = {};  // elements per index of each dim
  std::int64_t inner = 1;
  for (int d = n; d-- > 0;) {
    stride[d] = inner;
    inner *= block.shape[static_cast<std::size_t>(d)];
  }
  // Elements [x, end) as one box: whole indices of dim d, within one index of the dim before.
  auto take = [&](std::int64_t x, std::int64_t end, int d) {
    Box box = block;
    std::int64_t rest = x;
    for (int e = 0; e < n; ++e) {
      const auto i = static_cast<std::size_t>(e);
      const std::int64_t index = rest / stride[e];
      rest -= index * stride[e];
      if (e < d) {
        box.offset[i] += index;
        box.shape[i] = 1;
      } else if (e == d) {
        box.offset[i] += index;
        box.shape[i] = (end - x) / stride[e];
      }
    }
    out.push_back(box);
  };
  std::int64_t x = a;
  int d = n - 1;
  for (; d > 0; --d) {  // x is whole in dim d: up to the next index of dim d-1
    if (x % stride[d - 1] == 0) continue;
    const std::int64_t up = (x / stride[d - 1] + 1) * stride[d - 1];
    if (up > b) break;
    take(x, up, d);
    x = up;
  }
  for (; d < n; ++d) {  // then as many whole indices of each finer dim as fit
    const std::int64_t end = b / stride[d] * stride[d];
    if (end > x) take(x, end, d);
    x = end > x ? end : x;
  }
}

// The boxes of elements [a, b) of `block` in the order with tensor dim `outer` outermost (0:
// row-major), as row_major_run_boxes: each box is one run of the block in that order.
constexpr void run_boxes(const Box& block, std::int64_t a, std::int64_t b, RunBoxes& out,
                         int outer = 0) {
  if (outer == 0) {
    row_major_run_boxes(block, a, b, out);
    return;
  }
  RunBoxes moved;
  row_major_run_boxes(outer_first(block, outer), a, b, moved);
  for (const Box& box : moved) out.push_back(outer_back(box, outer));
}

// Whether `piece`, a box inside the row-major block `block`, is one contiguous run of it: every
// dim after its first of extent above 1 is whole.
constexpr bool contiguous_in(const Box& piece, const Box& block) {
  std::size_t d = 0;
  while (d < piece.shape.size() && piece.shape[d] == 1) ++d;
  for (std::size_t e = d + 1; e < piece.shape.size(); ++e)
    if (piece.shape[e] != block.shape[e]) return false;
  return true;
}

// Where `piece`, a box inside `whole`, lies in the order of the block's elements with tensor dim
// `outer` outermost (0: row-major) when it is one run of it there (contiguous_in of the boxes
// moved by outer_first): [first, last) of its elements; {0, -1} otherwise, {0, 0} when empty.
struct ElementRun {
  std::int64_t first = 0;
  std::int64_t last = 0;
};
constexpr ElementRun element_run(const Box& piece, const Box& whole, int outer = 0) {
  if (piece.empty()) return {};
  const Box in = outer_first(piece, outer), block = outer_first(whole, outer);
  if (!contiguous_in(in, block)) return {0, -1};
  std::int64_t at = 0;
  for (std::size_t e = 0; e < block.shape.size(); ++e)
    at = at * block.shape[e] + (in.offset[e] - block.offset[e]);
  return {at, at + in.numel()};
}

// How one group cuts its block: along tensor dim `dim`, the i-th range [cut[i], cut[i+1]) to
// member i (member g-1-i when `reversed`); or, `by_elements`, the i-th run [cut[i], cut[i+1]) of
// the block's elements in the order with tensor dim `outer` outermost (from 0; a few boxes each,
// run_boxes): row-major where `outer` is 0.
struct GroupParts {
  Box block;
  int members = 0;
  int dim = 0;
  bool reversed = false;
  bool by_elements = false;
  int outer = 0;
  std::int64_t cut[max_reducing_group + 1] = {};

  // Member j's part of the block, cut along `dim` (not by_elements).
  [[nodiscard]] constexpr Box part(int j) const {
    Box b = block;
    if (b.shape.empty()) return b;
    const int i = reversed ? members - 1 - j : j;
    b.offset[dim] = cut[i];
    b.shape[dim] = cut[i + 1] - cut[i];
    return b;
  }

  // The elements in member j's part.
  [[nodiscard]] constexpr std::int64_t part_numel(int j) const {
    if (!by_elements) return part(j).numel();
    const int i = reversed ? members - 1 - j : j;
    return cut[i + 1] - cut[i];
  }

  // Member j's part as boxes: the one part, or its run's boxes (none when empty).
  [[nodiscard]] constexpr RunBoxes part_boxes(int j) const {
    RunBoxes out;
    if (!by_elements) {
      const Box b = part(j);
      if (!b.empty()) out.push_back(b);
      return out;
    }
    const int i = reversed ? members - 1 - j : j;
    run_boxes(block, cut[i], cut[i + 1], out, outer);
    return out;
  }

  // Where member j's part starts in the block's elements in that order (by_elements).
  [[nodiscard]] constexpr std::int64_t part_first(int j) const {
    return cut[reversed ? members - 1 - j : j];
  }
};

// What a target block `want` holds of the parts of a group's block other than member j's: their
// elements in it, and how many of those parts meet it.
struct OtherParts {
  std::int64_t elements = 0;
  int parts = 0;
};

// The least x in [low, high] where `holds(x)`, which holds at `high` and from where it first
// holds on (binary search).
template <class Holds>
constexpr std::int64_t least_where(std::int64_t low, std::int64_t high, Holds holds) {
  while (low < high) {
    const std::int64_t mid = low + (high - low) / 2;
    if (holds(mid))
      high = mid;
    else
      low = mid + 1;
  }
  return high;
}

// The non-empty ranges among the first i of a group's cut, for i in [0, members], into `out`.
constexpr void non_empty_ranges(const GroupParts& parts, int* out) {
  out[0] = 0;
  for (int i = 0; i < parts.members; ++i)
    out[i + 1] = out[i] + (parts.cut[i + 1] > parts.cut[i] ? 1 : 0);
}

// other_parts_in: the parts are consecutive ranges of one line (indices of the cut dim, or the
// block's elements in the order of the cut), and `want` meets the block in a range of it (a run,
// where the cut is by elements: group_parts cuts so only where every member's target does), so
// the parts that meet it are found by binary search over the cuts, and counted by
// `non_empty[i]`, the non-empty ranges among the first i (non_empty_ranges). Otherwise (no tensor
// dims, or a target that meets the block in no one run) each part's boxes are met one by one.
constexpr OtherParts other_parts_in(const GroupParts& parts, const int* non_empty, const Box& want,
                                    int j) {
  OtherParts out;
  const Box in = intersect(want, parts.block);
  if (in.empty()) return out;
  const int g = parts.members;
  std::int64_t a = 0, b = 0, per_index = 1;  // `in` as the range [a, b) of the line
  bool line = !parts.block.shape.empty();
  if (line && parts.by_elements) {
    const ElementRun r = element_run(in, parts.block, parts.outer);
    line = r.last >= r.first;
    a = r.first;
    b = r.last;
  } else if (line) {
    const auto d = static_cast<std::size_t>(parts.dim);
    a = in.offset[d];
    b = a + in.shape[d];
    per_index = in.numel() / in.shape[d];
  }
  // (The ranges cover the line: group_parts cuts every block so; a check costs little.)
  if (line)
    line = parts.cut[g] - parts.cut[0] ==
           (parts.by_elements ? parts.block.numel()
                              : parts.block.shape[static_cast<std::size_t>(parts.dim)]);
  if (!line) {
    for (int i = 0; i < g; ++i) {
      if (i == j) continue;
      std::int64_t n = 0;
      for (const Box& box : parts.part_boxes(i)) n += overlap_numel(want, box);
      out.elements += n;
      out.parts += n > 0 ? 1 : 0;
    }
    return out;
  }
  // Ranges i (member reversed ? g-1-i : i) in [first, last) end after a and start before b.
  const std::int64_t* cut = parts.cut;
  const auto first =
      static_cast<int>(least_where(0, g, [&](std::int64_t i) { return i == g || cut[i + 1] > a; }));
  const auto last = static_cast<int>(
      least_where(first, g, [&](std::int64_t i) { return i == g || cut[i] >= b; }));
  out.parts = non_empty[last] - non_empty[first];
  const int mine = parts.reversed ? g - 1 - j : j;
  const std::int64_t lo = cut[mine] > a ? cut[mine] : a;
  const std::int64_t hi = cut[mine + 1] < b ? cut[mine + 1] : b;
  if (hi > lo) --out.parts;
  out.elements = in.numel() - (hi > lo ? bytes_mul(per_index, hi - lo) : 0);
  return out;
}

// The most a cut can save along one tensor dim: every row (index) saves at most the largest
// cross[j] of the members j whose range [t_lo[j], t_hi[j]) holds it (only one member owns it).
// Between two neighbouring ends of the ranges every range holds all rows or none: each range
// raises the most of the segments it spans (found by binary search), which is linear in the
// members where the ranges are disjoint or alike (a target's shards, or a whole dim).
constexpr std::int64_t rows_saved(const static_vector<std::int64_t, max_reducing_group>& cross,
                                  const static_vector<std::int64_t, max_reducing_group>& t_lo,
                                  const static_vector<std::int64_t, max_reducing_group>& t_hi,
                                  int g) {
  static_vector<std::int64_t, std::size_t{2} * max_reducing_group> ends;
  for (int j = 0; j < g; ++j)
    if (cross[j] != 0) {
      ends.push_back(t_lo[j]);
      ends.push_back(t_hi[j]);
    }
  if (ends.size() > 16) {
    std::sort(ends.begin(), ends.end());
  } else {  // small groups: in place, as std::sort would, without its dispatch
    for (std::size_t i = 1; i < ends.size(); ++i)
      for (std::size_t k = i; k > 0 && ends[k - 1] > ends[k]; --k) std::swap(ends[k - 1], ends[k]);
  }
  std::size_t n = 0;  // distinct ends
  for (std::size_t i = 0; i < ends.size(); ++i)
    if (n == 0 || ends[i] != ends[n - 1]) ends[n++] = ends[i];
  if (n < 2) return 0;
  // The most of each segment [ends[i], ends[i+1]), i < n - 1 (the others are never read).
  std::int64_t most[std::size_t{2} * max_reducing_group];  // NOLINT(*-member-init): below
  for (std::size_t i = 0; i + 1 < n; ++i) most[i] = 0;
  auto at = [&](std::int64_t x) {  // the index of end x
    const auto first = ends.begin();
    return static_cast<std::size_t>(
        std::lower_bound(first, first + static_cast<std::ptrdiff_t>(n), x) - first);
  };
  for (int j = 0; j < g; ++j) {
    if (cross[j] == 0) continue;
    for (std::size_t i = at(t_lo[j]), end = at(t_hi[j]); i < end; ++i)
      most[i] = cross[j] > most[i] ? cross[j] : most[i];
  }
  std::int64_t saved = 0;
  for (std::size_t i = 0; i + 1 < n; ++i)
    saved = bytes_add(saved, bytes_mul(most[i], ends[i + 1] - ends[i]));
  return saved;
}

// The parts of the group of `coord` (reduced dims `dims`, at most max_reducing_group
// members) in an exchange from `before` to `after`: over every tensor dim and both orders of the
// members, the cut whose busiest member receives the fewest elements (binary search on that
// count; each member's count grows with its range, so the members take, in order, the longest
// ranges within it), and at that count the smallest largest part (binary search on its extent:
// the first round's slowest member). Ties keep the first dim, forward order. With `by_elements`,
// also the cuts of the block's elements in row-major order, then in the order with each later
// tensor dim outermost, where every member's target meets the block in one run of it
// (element_run), when its busiest member receives fewer elements than any cut before: a part of
// an uneven block ends between rows (or columns) there.
constexpr GroupParts group_parts(const Layout& base, const Placements& before,
                                 const Placements& after, unsigned dims, const MeshCoord& coord,
                                 bool by_elements = false) {
  const DeviceMesh& mesh = base.mesh();
  GroupParts out;
  out.block = base.local_box(before, coord);
  out.members = group_size(mesh, dims);
  const int g = out.members, nd = base.tensor_ndim();
  const Box& block = out.block;
  if (nd == 0) return out;
  if (block.empty()) {
    for (int i = 0; i <= g; ++i) out.cut[i] = block.offset[0];
    return out;
  }
  // Per member: its target block's size, and the part of that block in the group's block.
  // (Only the members' entries are written: the vectors' other slots are never touched.)
  using PerMember = static_vector<std::int64_t, max_reducing_group>;
  PerMember target;
  static_vector<Box, max_reducing_group> inside;
  std::int64_t most_target = 0;
  for (int j = 0; j < g; ++j) {
    const Box t = base.local_box(after, group_member(mesh, coord, dims, j));
    target.push_back(t.numel());
    inside.push_back(intersect(t, block));
    most_target = t.numel() > most_target ? t.numel() : most_target;
  }
  // Where every member's target meets the block alike (their targets differ only outside it,
  // as where the target does not shard the reduced dims), the reversed order is the forward
  // one's mirror: the same counts, and a tie keeps the forward one.
  bool alike = true;
  for (int j = 1; j < g && alike; ++j) alike = target[j] == target[0] && inside[j] == inside[0];
  std::int64_t best = -1, best_largest = 0;
  // The best cut of [lo, hi) (indices of dim d; where d is negative, elements in the order with
  // tensor dim -1-d outermost), whose every index costs its owner `per_row` elements in the first
  // round, less cross[j] in the second where member j's target holds it ([t_lo[j], t_hi[j])), and
  // holds `row` elements. `strict`: only a count below the best so far replaces it.
  auto search = [&](int d, std::int64_t lo, std::int64_t hi, std::int64_t per_row, std::int64_t row,
                    const PerMember& cross, const PerMember& t_lo, const PerMember& t_hi,
                    bool strict) {
    // The farthest end e of a range from x for member j whose count is at most `limit` (-1
    // when even the empty range's is more): the count is piecewise linear in e.
    auto reach = [&](int j, std::int64_t x, std::int64_t limit) -> std::int64_t {
      std::int64_t count = target[j];
      if (count > limit) return -1;
      const std::int64_t p1 = t_lo[j] < x ? x : (t_lo[j] > hi ? hi : t_lo[j]);
      const std::int64_t p2 = t_hi[j] < p1 ? p1 : (t_hi[j] > hi ? hi : t_hi[j]);
      const std::int64_t ends[3] = {p1, p2, hi};
      const std::int64_t slopes[3] = {per_row, per_row - cross[j], per_row};
      std::int64_t from = x;
      for (int r = 0; r < 3; ++r) {
        const std::int64_t at_end = bytes_add(count, bytes_mul(slopes[r], ends[r] - from));
        if (at_end > limit) return from + (limit - count) / slopes[r];
        count = at_end;
        from = ends[r];
      }
      return hi;
    };
    const std::int64_t all = hi - lo;
    // Under any cut the busiest member's count is at least every member's empty range's and
    // the members' mean, where a row saves at most the most any member whose target holds it
    // saves (rows_saved): where that is reached (often) the search below is one test.
    std::int64_t total = bytes_mul(per_row, all) - rows_saved(cross, t_lo, t_hi, g);
    for (int j = 0; j < g; ++j) total = bytes_add(total, target[j]);
    const std::int64_t mean = (total + g - 1) / g;
    const std::int64_t least = mean > most_target ? mean : most_target;
    // The busiest count of the cut where each member takes the indices its target holds, the
    // members in order (reversed or not); -1 where those ranges do not tile [lo, hi) so.
    auto own_cut_count = [&](bool reversed) -> std::int64_t {
      std::int64_t x = lo, most = 0;
      for (int i = 0; i < g; ++i) {
        const int j = reversed ? g - 1 - i : i;
        std::int64_t len = 0;
        if (cross[j] != 0 && t_hi[j] > t_lo[j]) {
          if (t_lo[j] != x) return -1;
          len = t_hi[j] - t_lo[j];
        }
        const std::int64_t count = bytes_add(target[j], bytes_mul(per_row - cross[j], len));
        most = count > most ? count : most;
        x += len;
      }
      return x == hi ? most : -1;
    };
    for (const bool reversed : {false, true}) {
      if (reversed && alike) break;
      // Whether every member's count can be at most `limit` with at most `rows` indices each
      // (the cuts into `cut`, when given).
      auto fits = [&](std::int64_t limit, std::int64_t rows, std::int64_t* cut) {
        std::int64_t x = lo;
        for (int i = 0; i < g; ++i) {
          std::int64_t e = reach(reversed ? g - 1 - i : i, x, limit);
          if (e < 0) return false;
          if (e - x > rows) e = x + rows;
          if (cut != nullptr) cut[i + 1] = e;
          x = e;
        }
        return x == hi;
      };
      std::int64_t high = bytes_add(most_target, bytes_mul(per_row, all));
      if (best >= 0 && best < high) high = best;
      if (strict && best >= 0 && high == best) --high;
      if (!fits(high, all, nullptr)) continue;
      // The least count that fits, in [least, high] (least is at most high: high fits). A later
      // dim or order must beat or tie the best so far, and a tie is one test more.
      std::int64_t count = high;
      if (least < high) {
        const bool ties = best >= 0 && high == best && !fits(high - 1, all, nullptr);
        if (!ties && fits(least, all, nullptr)) {
          count = least;
        } else if (!ties) {
          // The cut where each member takes the indices its own target holds (a reduce-scatter's,
          // where the targets tile the range in member order) fits at its busiest count, often
          // the least that does: two tests then, instead of a search up from `least`.
          std::int64_t top = high;
          const std::int64_t own = own_cut_count(reversed);
          if (own > least && own < high && fits(own, all, nullptr)) top = own;
          auto fits_all = [&](std::int64_t c) { return fits(c, all, nullptr); };
          count = top == high                    ? least_where(least + 1, high, fits_all)
                  : !fits(top - 1, all, nullptr) ? top
                                                 : least_where(least + 1, top - 1, fits_all);
        }
      }
      // At that count, the smallest largest part (the first round's slowest member): an even
      // cut's, often; else at most the largest part of the cut without a limit on parts, and
      // often that.
      const std::int64_t even = (all + g - 1) / g;
      std::int64_t rows = even;
      if (!fits(count, even, nullptr)) {
        std::int64_t free_cut[max_reducing_group + 1] = {lo};
        fits(count, all, free_cut);
        std::int64_t most = 0;
        for (int i = 0; i < g; ++i)
          most = free_cut[i + 1] - free_cut[i] > most ? free_cut[i + 1] - free_cut[i] : most;
        rows = most <= even + 1 || !fits(count, most - 1, nullptr)
                   ? most
                   : least_where(even + 1, most - 1,
                                 [&](std::int64_t r) { return fits(count, r, nullptr); });
      }
      const std::int64_t largest = bytes_mul(rows, row);
      if (best >= 0 && (count > best || (count == best && largest >= best_largest))) continue;
      best = count;
      best_largest = largest;
      out.dim = d < 0 ? 0 : d;
      out.by_elements = d < 0;
      out.outer = d < 0 ? -1 - d : 0;
      out.reversed = reversed;
      out.cut[0] = lo;
      fits(count, rows, out.cut);
    }
  };
  for (int d = 0; d < nd; ++d) {
    PerMember cross, t_lo, t_hi;
    for (int j = 0; j < g; ++j) {
      const Box& in = inside[j];
      const bool none = in.empty();
      cross.push_back(none ? 0 : in.numel() / in.shape[d]);
      t_lo.push_back(none ? 0 : in.offset[d]);
      t_hi.push_back(none ? 0 : in.offset[d] + in.shape[d]);
    }
    const std::int64_t row = block.numel() / block.shape[d];
    search(d, block.offset[d], block.offset[d] + block.shape[d], bytes_mul(g - 1, row), row, cross,
           t_lo, t_hi, false);
  }
  for (int outer = 0; by_elements && g > 1 && outer < nd; ++outer) {
    PerMember cross, t_lo, t_hi;
    bool runs = true;
    for (int j = 0; j < g && runs; ++j) {
      const ElementRun r = element_run(inside[j], block, outer);
      runs = r.last >= r.first;
      cross.push_back(r.last > r.first ? 1 : 0);
      t_lo.push_back(r.first);
      t_hi.push_back(r.last);
    }
    if (runs) search(-1 - outer, 0, block.numel(), g - 1, 1, cross, t_lo, t_hi, true);
  }
  return out;
}

// Whether, in the order of the block's elements with some tensor dim outermost, every member of
// the group of `coord` (on the mesh dims `dims`) has a target block that meets the group's block
// in one run of it, or not at all: where group_parts may cut by elements.
constexpr bool targets_meet_in_runs(const Layout& base, const Placements& before,
                                    const Placements& after, unsigned dims,
                                    const MeshCoord& coord) {
  const DeviceMesh& mesh = base.mesh();
  const Box block = base.local_box(before, coord);
  if (base.tensor_ndim() == 0 || block.empty()) return false;
  for (int outer = 0; outer < base.tensor_ndim(); ++outer) {
    bool runs = true;
    for (int j = 0; j < group_size(mesh, dims) && runs; ++j) {
      const Box in = intersect(base.local_box(after, group_member(mesh, coord, dims, j)), block);
      const ElementRun r = element_run(in, block, outer);
      runs = r.last >= r.first;
    }
    if (runs) return true;
  }
  return false;
}

// Whether some group of an exchange from `before` to `after` (reducing the mesh dims `dims`)
// cuts its block by elements where it may (group_parts).
constexpr bool cuts_by_elements(const Layout& base, const Placements& before,
                                const Placements& after, unsigned dims) {
  const DeviceMesh& mesh = base.mesh();
  for (int i = 0; i < mesh.size(); ++i) {
    const MeshCoord c = mesh.coordinate_at(i);
    if (group_index(mesh, c, dims) == 0 && targets_meet_in_runs(base, before, after, dims, c) &&
        group_parts(base, before, after, dims, c, true).by_elements)
      return true;
  }
  return false;
}

}  // namespace dtensor::detail
