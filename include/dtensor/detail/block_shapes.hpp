#pragma once

#include <cstdint>

#include "../config.hpp"
#include "../layout.hpp"
#include "step_cost.hpp"

// The kinds of block pair that the ranks of a mesh hold under two placements, told apart by
// their extents and overlaps alone: what a collective step costs a rank depends on nothing else,
// so its busiest rank is found among one pair of each kind instead of among every rank.
namespace dtensor::detail {

// Along one tensor dim: a rank's extent under the placements before and after, and how much of
// the two ranges overlap.
struct DimExtents {
  std::int64_t before;
  std::int64_t after;
  std::int64_t overlap;
};

// Calls f(have, want) once for each kind of block pair (before, after) that some rank holds, with
// boxes of that kind's extents and overlaps (not a rank's offsets). A rank's range along tensor
// dim d depends only on its coordinates on the mesh dims that cut d, on either side; tensor dims
// that a mesh dim links (cutting one before and another after) are taken together. The kinds of
// each such group are found by visiting its mesh dims' coordinates alone, and every combination
// of the groups' kinds is some rank's. Returns false, having called nothing, where a group has
// more than max_kinds kinds or would visit more than max_visits coordinates.
template <class F>
constexpr bool for_each_block_shape(const Layout& base, const Placements& before,
                                    const Placements& after, F&& f) {
  constexpr int max_kinds = 16;
  constexpr int max_visits = 4096;
  const DeviceMesh& mesh = base.mesh();
  const int n = mesh.ndim(), nd = base.tensor_ndim();
  // The group of each tensor dim: the smallest dim linked to it.
  int group[max_tensor_dims] = {};
  for (int d = 0; d < nd; ++d) group[d] = d;
  for (int k = 0; k < n; ++k)
    if (before[k].is_shard() && after[k].is_shard() && before[k].dim() != after[k].dim()) {
      const int a = group[before[k].dim()], b = group[after[k].dim()];
      const int lo = a < b ? a : b, hi = a < b ? b : a;
      for (int d = 0; d < nd; ++d)
        if (group[d] == hi) group[d] = lo;
    }
  // Each group's kinds: kinds[g] of them, kind t's extents along dim d at extents[d][t].
  int kinds[max_tensor_dims] = {};
  DimExtents extents[max_tensor_dims][max_kinds];
  // Per tensor dim, the mesh dims that cut it before and after, in mesh order: a rank's ranges
  // as held_ranges (planner.hpp) cuts them, without asking every mesh dim at every coordinate.
  int cuts_before[max_tensor_dims][max_mesh_dims];
  int cuts_after[max_tensor_dims][max_mesh_dims];
  int n_before[max_tensor_dims] = {}, n_after[max_tensor_dims] = {};
  for (int k = 0; k < n; ++k) {
    if (before[k].is_shard()) cuts_before[before[k].dim()][n_before[before[k].dim()]++] = k;
    if (after[k].is_shard()) cuts_after[after[k].dim()][n_after[after[k].dim()]++] = k;
  }
  auto cut = [&](Range r, const int* cuts, int count, const MeshCoord& c) {
    for (int j = 0; j < count; ++j) {
      const int k = cuts[j];
      const Range piece = chunk_range(r.size, mesh.size(k), c[k], base.policy());
      r = {r.start + piece.start, piece.size};
    }
    return r;
  };
  const MeshCoord origin(static_cast<std::size_t>(n), 0);
  for (int g = 0; g < nd; ++g) {
    if (group[g] != g) continue;
    int dims[max_tensor_dims];
    int ndims = 0;
    for (int d = 0; d < nd; ++d)
      if (group[d] == g) dims[ndims++] = d;
    // The group's coordinates: those on the mesh dims that cut one of its dims.
    bool fixed[max_mesh_dims] = {};
    for (int k = 0; k < n; ++k)
      fixed[k] = !(before[k].is_shard() && group[before[k].dim()] == g) &&
                 !(after[k].is_shard() && group[after[k].dim()] == g);
    if (visited_coords(mesh, fixed) > max_visits) return false;
    bool fits = true;
    for_each_coord_while(mesh, origin, fixed, [&](const MeshCoord& c) {
      DimExtents mine[max_tensor_dims];  // the group's dims, in `dims` order
      for (int i = 0; i < ndims; ++i) {
        const int d = dims[i];
        const Range whole{0, base.global_shape()[d]};
        const Range rb = cut(whole, cuts_before[d], n_before[d], c);
        const Range ra = cut(whole, cuts_after[d], n_after[d], c);
        const std::int64_t lo = rb.start > ra.start ? rb.start : ra.start;
        const std::int64_t hi_b = rb.start + rb.size, hi_a = ra.start + ra.size;
        const std::int64_t hi = hi_b < hi_a ? hi_b : hi_a;
        mine[i] = {rb.size, ra.size, hi > lo ? hi - lo : 0};
      }
      bool known = false;
      for (int t = kinds[g] - 1; t >= 0 && !known; --t) {  // the latest kind first
        known = true;
        for (int i = 0; i < ndims && known; ++i) {
          const DimExtents& e = extents[dims[i]][t];
          known = e.before == mine[i].before && e.after == mine[i].after &&
                  e.overlap == mine[i].overlap;
        }
      }
      if (known) return true;
      if (kinds[g] == max_kinds) return fits = false;
      for (int i = 0; i < ndims; ++i) extents[dims[i]][kinds[g]] = mine[i];
      ++kinds[g];
      return true;
    });
    if (!fits) return false;
  }
  // Every combination of the groups' kinds: boxes from 0 before and, after, overlapping by the
  // kind's overlap.
  int pick[max_tensor_dims] = {};
  Box have{Shape(static_cast<std::size_t>(nd), 0), Shape(static_cast<std::size_t>(nd), 0)};
  Box want = have;
  while (true) {
    for (int d = 0; d < nd; ++d) {
      const DimExtents& e = extents[d][pick[group[d]]];
      have.shape[d] = e.before;
      want.offset[d] = e.before - e.overlap;
      want.shape[d] = e.after;
    }
    f(have, want);
    int g = nd - 1;
    for (; g >= 0; --g) {
      if (group[g] != g) continue;
      if (++pick[g] < kinds[g]) break;
      pick[g] = 0;
    }
    if (g < 0) return true;
  }
}

}  // namespace dtensor::detail
