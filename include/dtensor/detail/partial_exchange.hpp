#pragma once

#include <cstdint>

#include "../layout.hpp"
#include "../placement.hpp"
#include "static_vector.hpp"

// An exchange into a Partial: a step from placements without Partial to placements that make
// Partial(op) on some mesh dims (the made dims, one op on all). The ranks that differ only on the
// made dims (a group) share one target block, and the group's parts must reduce to it: each
// element goes to exactly one member, which holds its value, while the others hold the op's
// identity there. An element some member holds in its source block goes to the first such member
// (in coordinate order), at no cost; the others, held by none, are split evenly: taken in order
// (box after box of a fixed decomposition, each row-major), member i of g gets the i-th of g
// balanced runs, so the busiest member receives the group's share of the lower bound,
// ceil(missing / g), and no more.
namespace dtensor::detail {

// The most ranks on which an exchange into or from a Partial is planned: costing it keeps every
// rank's figures (each group's decomposition is found once, and each rank's receives are counted
// from the blocks that meet them, without visiting them on more than 8 ranks).
inline constexpr int max_partial_exchange_ranks = 1024;

// The most boxes a member's part may take (held and received together); a redistribution whose
// decomposition needs more is not planned this way.
inline constexpr std::size_t max_owned_boxes = 48;
using BoxList = static_vector<Box, max_owned_boxes>;

// The op the step makes Partial on the mesh dims where `after` is Partial and `before` is not,
// when there is one such dim or more, all of one op with an identity (sum, max, min, product; avg
// has none), and `before` has no Partial; ReduceOp::avg otherwise. `made` gets those dims as bits.
constexpr ReduceOp made_partial_op(const Placements& before, const Placements& after,
                                   unsigned* made = nullptr) noexcept {
  unsigned bits = 0;
  ReduceOp op = ReduceOp::avg;
  for (std::size_t k = 0; k < before.size() && k < after.size(); ++k) {
    if (before[k].is_partial()) return ReduceOp::avg;
    if (!after[k].is_partial()) continue;
    if (bits != 0 && after[k].reduce_op() != op) return ReduceOp::avg;
    op = after[k].reduce_op();
    bits |= 1u << k;
  }
  if (made != nullptr) *made = bits;
  return bits == 0 ? ReduceOp::avg : op;
}

// Whether an exchange from `before` to `after` makes a Partial (see made_partial_op).
constexpr bool makes_partial(const Placements& before, const Placements& after) noexcept {
  for (std::size_t k = 0; k < before.size() && k < after.size(); ++k)
    if (after[k].is_partial() && !before[k].is_partial()) return true;
  return false;
}

// Appends to `out` the boxes of `a` outside `b` (at most two per tensor dim); false when `out`
// runs out of room.
constexpr bool append_difference(const Box& a, const Box& b, BoxList& out) {
  if (a.empty()) return true;
  if (overlap_numel(a, b) == 0) {
    if (out.size() == max_owned_boxes) return false;
    out.push_back(a);
    return true;
  }
  Box rest = a;  // what is left to split: inside b on the dims done so far
  for (std::size_t d = 0; d < a.shape.size(); ++d) {
    const std::int64_t lo = rest.offset[d], hi = rest.offset[d] + rest.shape[d];
    const std::int64_t b_lo = b.offset[d] > lo ? b.offset[d] : lo;
    const std::int64_t b_hi = b.offset[d] + b.shape[d] < hi ? b.offset[d] + b.shape[d] : hi;
    if (b_lo > lo) {
      Box below = rest;
      below.shape[d] = b_lo - lo;
      if (out.size() == max_owned_boxes) return false;
      out.push_back(below);
    }
    if (b_hi < hi) {
      Box above = rest;
      above.offset[d] = b_hi;
      above.shape[d] = hi - b_hi;
      if (out.size() == max_owned_boxes) return false;
      out.push_back(above);
    }
    rest.offset[d] = b_lo;
    rest.shape[d] = b_hi - b_lo;
  }
  return true;
}

// Appends to `out` the boxes that make up the elements [lo, hi) of `box` in row-major order,
// from tensor dim `d` on (the dims before d have extent 1 in `box`): at most two per dim and one
// more. False when `out` runs out of room.
// NOLINTNEXTLINE(misc-no-recursion): one level per tensor dim
constexpr bool append_run(const Box& box, std::size_t d, std::int64_t lo, std::int64_t hi,
                          BoxList& out) {
  if (hi <= lo) return true;
  if (d == box.shape.size()) {
    if (out.size() == max_owned_boxes) return false;
    out.push_back(box);
    return true;
  }
  std::int64_t inner = 1;  // elements per index of dim d
  for (std::size_t e = d + 1; e < box.shape.size(); ++e) inner *= box.shape[e];
  auto slab = [&](std::int64_t first, std::int64_t count) {
    Box s = box;
    s.offset[d] += first;
    s.shape[d] = count;
    return s;
  };
  const std::int64_t first = lo / inner, last = hi / inner;  // the slabs lo and hi fall in
  if (first == last)
    return append_run(slab(first, 1), d + 1, lo - first * inner, hi - first * inner, out);
  std::int64_t whole_from = first;
  if (lo % inner != 0) {
    if (!append_run(slab(first, 1), d + 1, lo - first * inner, inner, out)) return false;
    ++whole_from;
  }
  if (last > whole_from) {
    if (out.size() == max_owned_boxes) return false;
    out.push_back(slab(whole_from, last - whole_from));
  }
  return append_run(slab(last, 1), d + 1, 0, hi - last * inner, out);
}

// What of its group's target block no member of the group of `coord` holds in its source block
// (an exchange from `before` into `after`, made_partial_op not avg), as the boxes the members
// split (`boxes`, `total` elements), with the group's size and the index of `coord` in it (the
// members in coordinate order, the last made dim fastest). `held`, when given, gets the boxes
// `coord` keeps from its own source block: the rest of the block it is the first to hold. `ok`
// is false when the decomposition needs more than max_owned_boxes boxes.
struct GroupUnheld {
  BoxList boxes;
  std::int64_t total = 0;
  int members = 0;
  int me = 0;
  bool ok = true;
};

constexpr GroupUnheld group_unheld(const Layout& base, const Placements& before,
                                   const Placements& after, const MeshCoord& coord,
                                   BoxList* held = nullptr) {
  GroupUnheld out;
  unsigned made = 0;
  made_partial_op(before, after, &made);
  const DeviceMesh& mesh = base.mesh();
  const Box block = base.local_box(after, coord);
  if (block.empty()) return out;
  out.boxes.push_back(block);
  MeshCoord m = coord;
  for (int k = 0; k < mesh.ndim(); ++k)
    if ((made >> k & 1u) != 0) m[k] = 0;
  for (;;) {
    const bool is_me = m == coord;
    if (is_me) out.me = out.members;
    ++out.members;
    const Box source = base.local_box(before, m);
    BoxList rest;
    for (const Box& u : out.boxes) {
      if (is_me && held != nullptr) {
        const Box kept = intersect(u, source);
        if (!kept.empty()) {
          if (held->size() == max_owned_boxes) return out.ok = false, out;
          held->push_back(kept);
        }
      }
      if (!append_difference(u, source, rest)) return out.ok = false, out;
    }
    out.boxes = BoxList{};
    for (const Box& u : rest)
      if (!u.empty()) out.boxes.push_back(u);
    int k = mesh.ndim() - 1;
    for (; k >= 0; --k) {
      if ((made >> k & 1u) == 0) continue;
      if (++m[k] < mesh.size(k)) break;
      m[k] = 0;
    }
    if (k < 0) break;
  }
  for (const Box& u : out.boxes) out.total += u.numel();
  return out;
}

// Appends to `out` the boxes member `member` of the group receives: the member-th of `members`
// balanced runs of the unheld boxes taken in order. False when `out` runs out of room.
constexpr bool append_share(const GroupUnheld& group, int member, BoxList& out) {
  const std::int64_t lo = group.total * member / group.members;
  const std::int64_t hi = group.total * (member + 1) / group.members;
  std::int64_t at = 0;
  for (const Box& u : group.boxes) {
    const std::int64_t n = u.numel();
    const std::int64_t from = lo > at ? lo - at : 0, to = hi - at < n ? hi - at : n;
    if (from < to && !append_run(u, 0, from, to, out)) return false;
    at += n;
  }
  return true;
}

// The part of its group's target block that the rank at `coord` holds after an exchange from
// `before` into `after` (made_partial_op is not avg): `held`, the boxes it keeps from its own
// source block, and `received`, the boxes it gets from others (its share of group_unheld).
// `ok` is false when the decomposition needs more than max_owned_boxes boxes.
struct OwnedPart {
  BoxList held;
  BoxList received;
  bool ok = true;
};

constexpr OwnedPart owned_part(const Layout& base, const Placements& before,
                               const Placements& after, const MeshCoord& coord) {
  OwnedPart out;
  const GroupUnheld group = group_unheld(base, before, after, coord, &out.held);
  out.ok = group.ok && (group.members == 0 || append_share(group, group.me, out.received));
  return out;
}

}  // namespace dtensor::detail
