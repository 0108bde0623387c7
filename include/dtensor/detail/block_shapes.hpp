#pragma once

#include <cstdint>

#include "../config.hpp"
#include "../layout.hpp"

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
  constexpr std::int64_t max_visits = 4096;
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
  // Per tensor dim, the mesh dims that cut it before and after, in mesh order.
  int cuts_before[max_tensor_dims][max_mesh_dims];
  int cuts_after[max_tensor_dims][max_mesh_dims];
  int n_before[max_tensor_dims] = {}, n_after[max_tensor_dims] = {};
  for (int k = 0; k < n; ++k) {
    if (before[k].is_shard()) cuts_before[before[k].dim()][n_before[before[k].dim()]++] = k;
    if (after[k].is_shard()) cuts_after[after[k].dim()][n_after[after[k].dim()]++] = k;
  }
  for (int g = 0; g < nd; ++g) {
    if (group[g] != g) continue;
    int dims[max_tensor_dims];
    int ndims = 0;
    for (int d = 0; d < nd; ++d)
      if (group[d] == g) dims[ndims++] = d;
    bool varies[max_mesh_dims] = {};
    std::int64_t visits = 1;
    for (int i = 0; i < ndims; ++i) {
      for (int j = 0; j < n_before[dims[i]]; ++j) varies[cuts_before[dims[i]][j]] = true;
      for (int j = 0; j < n_after[dims[i]]; ++j) varies[cuts_after[dims[i]][j]] = true;
    }
    for (int k = 0; k < n; ++k) {
      if (varies[k]) visits *= mesh.size(k);
      if (visits > max_visits) return false;
    }
    MeshCoord c(static_cast<std::size_t>(n), 0);
    while (true) {
      // This coordinate's extents along the group's dims.
      DimExtents mine[max_tensor_dims];
      for (int i = 0; i < ndims; ++i) {
        const int d = dims[i];
        Range rb{0, base.global_shape()[d]}, ra = rb;
        for (int j = 0; j < n_before[d]; ++j) {
          const int k = cuts_before[d][j];
          const Range r = chunk_range(rb.size, mesh.size(k), c[k], base.policy());
          rb = {rb.start + r.start, r.size};
        }
        for (int j = 0; j < n_after[d]; ++j) {
          const int k = cuts_after[d][j];
          const Range r = chunk_range(ra.size, mesh.size(k), c[k], base.policy());
          ra = {ra.start + r.start, r.size};
        }
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
      if (!known) {
        if (kinds[g] == max_kinds) return false;
        for (int i = 0; i < ndims; ++i) extents[dims[i]][kinds[g]] = mine[i];
        ++kinds[g];
      }
      int k = n - 1;
      for (; k >= 0; --k) {
        if (!varies[k]) continue;
        if (++c[k] < mesh.size(k)) break;
        c[k] = 0;
      }
      if (k < 0) break;
    }
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
