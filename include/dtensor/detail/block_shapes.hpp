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

// The kinds of block pair of each group of tensor dims (below), found by block_kinds.
// NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): arrays written before they are read
struct BlockKinds {
  static constexpr int max_kinds = 16;
  // The group of each tensor dim (the smallest dim linked to it), and each group's kinds.
  int group[max_tensor_dims];
  int kinds[max_tensor_dims];
  // Kind t of a group: its extents along each of the group's dims d at extents[d][t]; with
  // pieces, the number of pieces of the source's cut that meet the target range at pieces[d][t];
  // and a rank of that kind, by its coordinate on each of the group's mesh dims k at rep[k][t].
  DimExtents extents[max_tensor_dims][max_kinds];
  std::int64_t pieces[max_tensor_dims][max_kinds];
  int rep[max_mesh_dims][max_kinds];
  // The group of the dims each mesh dim cuts (a mesh dim links the dims it cuts, so the groups'
  // mesh dims are disjoint), -1 where it cuts none.
  int mesh_ndim;
  int group_of_mesh_dim[max_mesh_dims];

  // Writes into `c`, on every mesh dim that cuts, the coordinates of the first rank (row-major)
  // of the combination `pick` of the groups' kinds (pick[g]: group g's kind): each group's first
  // rank of its kind, as its mesh dims are its own. Other coordinates are left as they are.
  constexpr void rank_of(const int* pick, MeshCoord& c) const {
    for (int k = 0; k < mesh_ndim; ++k)
      if (group_of_mesh_dim[k] >= 0) c[k] = rep[k][pick[group_of_mesh_dim[k]]];
  }
};

// Finds the kinds of block pair (before, after) of each group of tensor dims (see
// for_each_block_shape), told apart by extents and overlaps and, where `with_pieces`, by the
// number of non-empty pieces of `before`'s cut of each dim that meet the rank's range after.
// Returns false where a group has more than max_kinds kinds or would visit more than `max_visits`
// coordinates, or, with pieces, where `before` cuts a dim more than once.
constexpr bool block_kinds(const Layout& base, const Placements& before, const Placements& after,
                           bool with_pieces, BlockKinds& out, int max_visits = 4096) {
  constexpr int max_kinds = BlockKinds::max_kinds;
  const DeviceMesh& mesh = base.mesh();
  const int n = mesh.ndim(), nd = base.tensor_ndim();
  int* group = out.group;
  for (int d = 0; d < nd; ++d) group[d] = d, out.kinds[d] = 0;
  for (int k = 0; k < n; ++k)
    if (before[k].is_shard() && after[k].is_shard() && before[k].dim() != after[k].dim()) {
      const int a = group[before[k].dim()], b = group[after[k].dim()];
      const int lo = a < b ? a : b, hi = a < b ? b : a;
      for (int d = 0; d < nd; ++d)
        if (group[d] == hi) group[d] = lo;
    }
  out.mesh_ndim = n;
  for (int k = 0; k < n; ++k)
    out.group_of_mesh_dim[k] = before[k].is_shard()  ? group[before[k].dim()]
                               : after[k].is_shard() ? group[after[k].dim()]
                                                     : -1;
  // Per tensor dim, the mesh dims that cut it before and after, in mesh order: a rank's ranges
  // as held_ranges (planner.hpp) cuts them, without asking every mesh dim at every coordinate.
  int cuts_before[max_tensor_dims][max_mesh_dims];
  int cuts_after[max_tensor_dims][max_mesh_dims];
  int n_before[max_tensor_dims] = {}, n_after[max_tensor_dims] = {};
  for (int k = 0; k < n; ++k) {
    if (before[k].is_shard()) cuts_before[before[k].dim()][n_before[before[k].dim()]++] = k;
    if (after[k].is_shard()) cuts_after[after[k].dim()][n_after[after[k].dim()]++] = k;
  }
  if (with_pieces)
    for (int d = 0; d < nd; ++d)
      if (n_before[d] > 1) return false;
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
    int& count = out.kinds[g];
    int last = -1;  // the kind recorded before (neighbours are mostly alike)
    // Records a rank of the group at `c` whose block pair has extents `mine` and `pieces` along
    // the group's dims; each kind keeps its first rank in row-major order (`ordered`: no earlier
    // rank of its kind comes after). False where the kind would be one too many.
    auto record = [&](const DimExtents* mine, const std::int64_t* pieces, const MeshCoord& c,
                      bool ordered) {
      auto is_kind = [&](int t) {
        for (int i = 0; i < ndims; ++i) {
          const DimExtents& e = out.extents[dims[i]][t];
          if (e.before != mine[i].before || e.after != mine[i].after ||
              e.overlap != mine[i].overlap || (with_pieces && out.pieces[dims[i]][t] != pieces[i]))
            return false;
        }
        return true;
      };
      int t = last >= 0 && is_kind(last) ? last : -1;
      for (int u = count - 1; u >= 0 && t < 0; --u)
        if (u != last && is_kind(u)) t = u;
      if (t < 0) {
        if (count == max_kinds) return false;
        t = count++;
        for (int i = 0; i < ndims; ++i) {
          out.extents[dims[i]][t] = mine[i];
          out.pieces[dims[i]][t] = pieces[i];
        }
        ordered = false;  // written below as its first rank
        for (int k = 0; k < n; ++k)
          if (!fixed[k]) out.rep[k][t] = mesh.size(k);  // after every rank
      }
      last = t;
      if (ordered) return true;
      for (int k = 0; k < n; ++k) {
        if (fixed[k] || c[k] == out.rep[k][t]) continue;
        if (c[k] < out.rep[k][t])
          for (int j = 0; j < n; ++j)
            if (!fixed[j]) out.rep[j][t] = c[j];
        break;
      }
      return true;
    };
    bool fits = true;
    if (ndims == 1 && n_before[dims[0]] == 1 && n_after[dims[0]] == 1 &&
        cuts_before[dims[0]][0] != cuts_after[dims[0]][0]) {
      // One tensor dim, cut once before (mesh dim kb) and once after (ka): for each piece after,
      // the pieces before that meet it (consecutive, pieces_meeting_count) and, of the others
      // (overlap 0), one of each size, instead of every pair of pieces.
      const int d = dims[0], kb = cuts_before[d][0], ka = cuts_after[d][0];
      const int gb = mesh.size(kb), ga = mesh.size(ka);
      const std::int64_t total = base.global_shape()[d];
      const ChunkPolicy policy = base.policy();
      // The pieces before in runs of equal size: sizes never grow with the index (full pieces,
      // a short one, empty ones; balanced: one larger, then one smaller), so at most three runs.
      constexpr int max_runs = 3;
      int run_lo[max_runs] = {}, run_hi[max_runs] = {};
      std::int64_t run_size[max_runs] = {};
      int runs = 0;
      for (int j = 0; j < gb && runs < max_runs; ++runs) {
        const std::int64_t size = chunk_range(total, gb, j, policy).size;
        int a = j + 1, b = gb;  // the first piece after j that is smaller
        while (a < b) {
          const int m = a + (b - a) / 2;
          if (chunk_range(total, gb, m, policy).size < size)
            b = m;
          else
            a = m + 1;
        }
        run_lo[runs] = j;
        run_hi[runs] = a;
        run_size[runs] = size;
        j = a;
      }
      MeshCoord c = origin;
      int records = 0;  // bounded as the visits below
      for (int ja = 0; ja < ga && fits; ++ja) {
        if ((records += 1 + runs) > max_visits) return false;
        const Range ra = chunk_range(total, ga, ja, policy);
        c[ka] = ja;
        int first = 0, final_piece = -1;  // the pieces before that meet ra
        if (ra.size > 0) {
          first = piece_holding(total, gb, policy, ra.start);
          final_piece = piece_holding(total, gb, policy, ra.start + ra.size - 1);
        }
        const std::int64_t meeting = with_pieces ? final_piece - first + 1 : 0;
        if ((records += final_piece - first + 1) > max_visits) return false;
        for (int jb = first; jb <= final_piece && fits; ++jb) {
          const Range rb = chunk_range(total, gb, jb, policy);
          const DimExtents mine{rb.size, ra.size, overlap_size(rb, ra)};
          c[kb] = jb;
          fits = record(&mine, &meeting, c, false);
        }
        for (int r = 0; r < runs && fits; ++r) {
          const int jb =
              run_lo[r] >= first && run_lo[r] <= final_piece ? final_piece + 1 : run_lo[r];
          if (jb >= run_hi[r]) continue;
          const DimExtents mine{run_size[r], ra.size, 0};
          c[kb] = jb;
          fits = record(&mine, &meeting, c, false);
        }
      }
    } else {
      if (visited_coords(mesh, fixed) > max_visits) return false;
      for_each_coord_while(mesh, origin, fixed, [&](const MeshCoord& c) {
        DimExtents mine[max_tensor_dims];  // the group's dims, in `dims` order
        std::int64_t pieces[max_tensor_dims] = {};
        for (int i = 0; i < ndims; ++i) {
          const int d = dims[i];
          const Range whole{0, base.global_shape()[d]};
          const Range rb = cut(whole, cuts_before[d], n_before[d], c);
          const Range ra = cut(whole, cuts_after[d], n_after[d], c);
          mine[i] = {rb.size, ra.size, overlap_size(rb, ra)};
          // With one cut before at most: the pieces of that cut.
          if (with_pieces)
            pieces[i] = n_before[d] == 0
                            ? (ra.size > 0 ? 1 : 0)
                            : pieces_meeting_count(whole.size, mesh.size(cuts_before[d][0]),
                                                   base.policy(), ra.start, ra.start + ra.size);
        }
        fits = record(mine, pieces, c, true);  // visited in row-major order
        return fits;
      });
    }
    if (!fits) return false;
  }
  return true;
}

// Calls f(pick) for every combination of the groups' kinds of `kinds` (pick[g]: group g's kind,
// for the groups' first dims g), each some rank's.
template <class F>
constexpr void for_each_kind_combination(const BlockKinds& kinds, int nd, F&& f) {
  int pick[max_tensor_dims] = {};
  while (true) {
    f(static_cast<const int*>(pick));
    int g = nd - 1;
    for (; g >= 0; --g) {
      if (kinds.group[g] != g) continue;
      if (++pick[g] < kinds.kinds[g]) break;
      pick[g] = 0;
    }
    if (g < 0) return;
  }
}

// Calls f(have, want) once for each kind of block pair (before, after) that some rank holds, with
// boxes of that kind's extents and overlaps (not a rank's offsets). A rank's range along tensor
// dim d depends only on its coordinates on the mesh dims that cut d, on either side; tensor dims
// that a mesh dim links (cutting one before and another after) are taken together. The kinds of
// each such group are found by visiting its mesh dims' coordinates alone, and every combination
// of the groups' kinds is some rank's. Returns false, having called nothing, where a group has
// more than BlockKinds::max_kinds kinds or would visit more than 4096 coordinates.
template <class F>
constexpr bool for_each_block_shape(const Layout& base, const Placements& before,
                                    const Placements& after, F&& f) {
  BlockKinds kinds;  // NOLINT(cppcoreguidelines-pro-type-member-init): block_kinds writes it
  if (!block_kinds(base, before, after, false, kinds)) return false;
  const int nd = base.tensor_ndim();
  // Every combination of the groups' kinds: boxes from 0 before and, after, overlapping by the
  // kind's overlap.
  Box have{Shape(static_cast<std::size_t>(nd), 0), Shape(static_cast<std::size_t>(nd), 0)};
  Box want = have;
  for_each_kind_combination(kinds, nd, [&](const int* pick) {
    for (int d = 0; d < nd; ++d) {
      const DimExtents& e = kinds.extents[d][pick[kinds.group[d]]];
      have.shape[d] = e.before;
      want.offset[d] = e.before - e.overlap;
      want.shape[d] = e.after;
    }
    f(static_cast<const Box&>(have), static_cast<const Box&>(want));
  });
  return true;
}

// Whether every tensor dim is cut by at most one mesh dim under `before` and under `after`, as
// for_each_exchange_kind needs.
constexpr bool cut_at_most_once(const Placements& before, const Placements& after) {
  for (std::size_t k = 0; k < before.size(); ++k)
    for (std::size_t j = k + 1; j < before.size(); ++j)
      if ((before[k].is_shard() && before[j].is_shard() && before[k].dim() == before[j].dim()) ||
          (after[k].is_shard() && after[j].is_shard() && after[k].dim() == after[j].dim()))
        return false;
  return true;
}

// Calls f(coord) for one rank of each kind of an exchange between placements `before` and
// `after` (no Partial made or reduced) where every tensor dim is cut by at most one mesh dim on
// each side. There the exchange costs a rank (exchange_cost) by its extents and overlaps along
// every tensor dim and the number of source pieces that meet its target range (the messages it
// receives): ranks that agree on those cost alike. Returns false, having called nothing, where a
// dim is cut more than once, block_kinds finds too many kinds or would visit more than
// `max_visits` coordinates of a group, or their combinations number more than max_ranks.
template <class F>
constexpr bool for_each_exchange_kind(const Layout& base, const Placements& before,
                                      const Placements& after, F&& f, int max_visits = 4096) {
  constexpr std::int64_t max_ranks = 64;
  const DeviceMesh& mesh = base.mesh();
  const int n = mesh.ndim(), nd = base.tensor_ndim();
  if (exchange_reduces(before, after) || makes_partial(before, after) ||
      !cut_at_most_once(before, after))
    return false;
  BlockKinds kinds;  // NOLINT(cppcoreguidelines-pro-type-member-init): block_kinds writes it
  if (!block_kinds(base, before, after, true, kinds, max_visits)) return false;
  std::int64_t ranks = 1;
  for (int g = 0; g < nd; ++g)
    if (kinds.group[g] == g) ranks *= kinds.kinds[g];
  if (ranks > max_ranks) return false;
  // A rank of each combination, the other coordinates 0 (those mesh dims cut nothing).
  MeshCoord coord(static_cast<std::size_t>(n), 0);
  for_each_kind_combination(kinds, nd, [&](const int* pick) {
    kinds.rank_of(pick, coord);
    f(static_cast<const MeshCoord&>(coord));
  });
  return true;
}

}  // namespace dtensor::detail
