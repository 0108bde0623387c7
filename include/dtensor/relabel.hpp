#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "config.hpp"
#include "detail/checked.hpp"
#include "detail/why.hpp"
#include "device_mesh.hpp"
#include "errors.hpp"
#include "layout.hpp"
#include "placement.hpp"

// Rank relabelling (COSTA's idea): when two layouts differ mostly in which rank holds which
// block, renaming ranks moves fewer bytes than redistributing. find_relabelling(src, dst) picks
// the source rank that takes each target block so that as few bytes as possible move.
namespace dtensor {

// The most ranks find_relabelling handles (the capacity of a Relabelling's inline storage).
inline constexpr int max_relabel_ranks = 4096;
// The most ranks the exact method handles, and the size up to which automatic picks it.
inline constexpr int max_exact_relabel_ranks = 512;

// How find_relabelling assigns target blocks to ranks.
enum class RelabelMethod : std::uint8_t {
  // exact up to max_exact_relabel_ranks ranks, greedy beyond.
  automatic,
  // An optimal assignment (Kuhn-Munkres, O(n^3)): the fewest bytes received in total.
  exact,
  // Each target block in turn takes the free rank holding most of it: O(n^2) at worst, not
  // always optimal.
  greedy,
};

// "automatic", "exact", "greedy".
constexpr std::string_view name(RelabelMethod m) noexcept {
  switch (m) {
    case RelabelMethod::exact: return "exact";
    case RelabelMethod::greedy: return "greedy";
    case RelabelMethod::automatic: break;
  }
  return "automatic";
}

namespace detail {
struct relabel_builder;
}  // namespace detail

// Which rank takes which target block, and the bytes received before (every rank keeps its
// own position) and after. Ranks and blocks are positions in their mesh's row-major order
// (0..size()-1; DeviceMesh::rank_at gives the global rank): block q is the block the rank at
// position q of dst's mesh would hold, rank p the one at position p of src's mesh.
class Relabelling {
 public:
  // The number of ranks (and target blocks).
  [[nodiscard]] constexpr int size() const noexcept { return size_; }
  // The rank (position in src's mesh) that takes target block q.
  [[nodiscard]] constexpr int rank_for(int q) const {
    if (q < 0 || q >= size_) detail::fail<detail::why::index_out_of_range>(q, size_);
    return rank_for_[q];
  }
  // rank_for(q) for every q, in order.
  [[nodiscard]] constexpr std::span<const int> ranks() const noexcept {
    return {rank_for_, static_cast<std::size_t>(size_)};
  }
  // The method that found it: exact or greedy (never automatic).
  [[nodiscard]] constexpr RelabelMethod method() const noexcept { return method_; }

  // The most bytes any rank receives, and the bytes all ranks receive, without relabelling.
  [[nodiscard]] constexpr std::int64_t bytes_recv_max_before() const noexcept {
    return recv_max_before_;
  }
  [[nodiscard]] constexpr std::int64_t bytes_recv_total_before() const noexcept {
    return recv_total_before_;
  }
  // The same with this relabelling.
  [[nodiscard]] constexpr std::int64_t bytes_recv_max_after() const noexcept {
    return recv_max_after_;
  }
  [[nodiscard]] constexpr std::int64_t bytes_recv_total_after() const noexcept {
    return recv_total_after_;
  }

  // Whether, relabelled, every rank already holds its target block.
  [[nodiscard]] constexpr bool moves_nothing() const noexcept { return recv_total_after_ == 0; }
  // Whether every rank keeps its position.
  [[nodiscard]] constexpr bool is_identity() const noexcept {
    for (int q = 0; q < size_; ++q)
      if (rank_for_[q] != q) return false;
    return true;
  }

  friend constexpr bool operator==(const Relabelling&, const Relabelling&) noexcept = default;

 private:
  friend struct detail::relabel_builder;

  int rank_for_[max_relabel_ranks] = {};
  int size_ = 0;
  RelabelMethod method_ = RelabelMethod::exact;
  std::int64_t recv_max_before_ = 0;
  std::int64_t recv_max_after_ = 0;
  std::int64_t recv_total_before_ = 0;
  std::int64_t recv_total_after_ = 0;
};

namespace detail {

// The block of layout `l` held by the rank at row-major position `position` of its mesh.
constexpr Box box_at(const Layout& l, int position) {
  const DeviceMesh& mesh = l.mesh();
  MeshCoord c(static_cast<std::size_t>(mesh.ndim()), 0);
  for (int k = mesh.ndim(); k-- > 0;) {
    c[k] = position % mesh.size(k);
    position /= mesh.size(k);
  }
  return l.local_box(c);
}

// Visits the ranks of `l` from mesh dim k inwards whose blocks meet `target`: `outer` is the
// block cut by the dims before k and `position` the row-major position so far. Calls
// f(position, overlap, numel) with the elements they share and the size of the rank's block,
// in row-major order.
template <class F>
// NOLINTNEXTLINE(misc-no-recursion): bounded by the mesh's dims
constexpr void visit_overlapping(const Layout& l, const Box& target, int k, int position,
                                 Box& outer, F& f) {
  const DeviceMesh& mesh = l.mesh();
  if (k == mesh.ndim()) {
    const std::int64_t shared = overlap_numel(outer, target);
    if (shared > 0) f(position, shared, outer.numel());
    return;
  }
  const int g = mesh.size(k);
  const Placement p = l.placement(k);
  if (!p.is_shard()) {
    for (int j = 0; j < g; ++j) visit_overlapping(l, target, k + 1, position * g + j, outer, f);
    return;
  }
  const auto d = static_cast<std::size_t>(p.dim());
  const std::int64_t start = outer.offset[d], extent = outer.shape[d];
  const std::int64_t lo = target.offset[d], hi = lo + target.shape[d];
  for (int j = 0; j < g; ++j) {
    const Range r = chunk_range(extent, g, j, l.policy());
    const std::int64_t a = start + r.start, b = a + r.size;
    if (r.size == 0 || b <= lo || a >= hi) continue;
    outer.offset[d] = a;
    outer.shape[d] = r.size;
    visit_overlapping(l, target, k + 1, position * g + j, outer, f);
  }
  outer.offset[d] = start;
  outer.shape[d] = extent;
}

// Calls f(p, overlap, numel) for every rank p of `l` whose block shares elements with
// `target` (with the size of p's block), in row-major order, visiting no other rank.
template <class F>
constexpr void for_each_overlapping(const Layout& l, const Box& target, F&& f) {
  if (target.empty()) return;
  Box outer;
  outer.shape = l.global_shape();
  outer.offset.resize(outer.shape.size(), 0);
  visit_overlapping(l, target, 0, 0, outer, f);
}

// The cost of giving a target block to a rank, compared lexicographically: the elements it
// lacks, then whether it moves (so that among optimal assignments the identity wins).
struct AssignCost {
  std::int64_t missing = 0;
  std::int64_t moved = 0;

  friend constexpr AssignCost operator+(AssignCost a, AssignCost b) {
    return {bytes_add(a.missing, b.missing), a.moved + b.moved};
  }
  friend constexpr AssignCost operator-(AssignCost a, AssignCost b) {
    return {bytes_add(a.missing, -b.missing), a.moved - b.moved};
  }
  friend constexpr bool operator<(AssignCost a, AssignCost b) noexcept {
    return a.missing != b.missing ? a.missing < b.missing : a.moved < b.moved;
  }
};

struct relabel_builder {
  // Checks that the two layouts hold the same tensor on the same number of ranks, without
  // Partial placements.
  static constexpr void check(const Layout& src, const Layout& dst) {
    const int n = src.mesh().size();
    if (n != dst.mesh().size())
      fail<why::relabel_rank_count_mismatch>(src.mesh().shape(), n, dst.mesh().shape(),
                                             dst.mesh().size());
    if (!(src.global_shape() == dst.global_shape()))
      fail<why::layout_shape_mismatch>(src.global_shape(), dst.global_shape());
    if (src.dtype() != dst.dtype())
      fail<why::layout_dtype_mismatch>(name(src.dtype()), name(dst.dtype()));
    const Layout* sides[] = {&src, &dst};
    for (const Layout* l : sides)
      for (int k = 0; k < l->mesh().ndim(); ++k)
        if (l->placement(k).is_partial())
          fail<why::relabel_partial>(l == &src ? "source" : "target",
                                     name(l->placement(k).reduce_op()), k);
    if (n > max_relabel_ranks) fail<why::relabel_too_many_ranks>(max_relabel_ranks, n);
  }

  // Bytes received, the most by one rank and in all, when target block q goes to
  // rank_for[q].
  static constexpr void count(const Layout& src, const Layout& dst, const int* rank_for,
                              std::int64_t& most, std::int64_t& total) {
    most = 0;
    total = 0;
    for (int q = 0; q < src.mesh().size(); ++q) {
      const Box want = box_at(dst, q);
      const std::int64_t missing = want.numel() - overlap_numel(box_at(src, rank_for[q]), want);
      const std::int64_t bytes = missing * src.elem_bytes();
      most = bytes > most ? bytes : most;
      total = bytes_add(total, bytes);
    }
  }

  // Kuhn-Munkres (the O(n^3) shortest augmenting path form): target blocks are rows, ranks
  // columns. A row's costs are computed when needed from the ranks overlapping its block, so
  // the scratch is a few arrays of n entries.
  static constexpr void exact(const Layout& src, const Layout& dst, int* rank_for) {
    const int n = src.mesh().size();
    constexpr int cap = max_exact_relabel_ranks + 1;
    // 1-based: u (rows) and v (columns) are the potentials, row_of[j] the row column j serves
    // (0: none), way[j] the previous column on the augmenting path.
    AssignCost u[cap] = {}, v[cap] = {}, minv[cap] = {};
    int row_of[cap] = {}, way[cap] = {};
    bool used[cap] = {}, seen[cap] = {};
    std::int64_t shared[cap] = {};
    // The overlaps of row cached_row's block with every rank, and the block's size.
    int cached_row = 0;
    std::int64_t need = 0;
    for (int i = 1; i <= n; ++i) {
      row_of[0] = i;
      int j0 = 0;
      for (int j = 0; j <= n; ++j) used[j] = false, seen[j] = false;
      do {
        used[j0] = true;
        const int i0 = row_of[j0];
        const int q = i0 - 1;
        if (cached_row != i0) {
          const Box want = box_at(dst, q);
          for (int j = 0; j <= n; ++j) shared[j] = 0;
          for_each_overlapping(src, want,
                               [&](int p, std::int64_t o, std::int64_t) { shared[p + 1] = o; });
          need = want.numel();
          cached_row = i0;
        }
        AssignCost delta;
        int j1 = 0;
        for (int j = 1; j <= n; ++j) {
          if (used[j]) continue;
          const AssignCost c{need - shared[j], j - 1 == q ? 0 : 1};
          const AssignCost cur = c - u[i0] - v[j];
          if (!seen[j] || cur < minv[j]) minv[j] = cur, way[j] = j0, seen[j] = true;
          if (j1 == 0 || minv[j] < delta) delta = minv[j], j1 = j;
        }
        for (int j = 0; j <= n; ++j) {
          if (used[j]) {
            u[row_of[j]] = u[row_of[j]] + delta;
            v[j] = v[j] - delta;
          } else {
            minv[j] = minv[j] - delta;
          }
        }
        j0 = j1;
      } while (row_of[j0] != 0);
      do {
        const int j1 = way[j0];
        row_of[j0] = row_of[j1];
        j0 = j1;
      } while (j0 != 0);
    }
    for (int j = 1; j <= n; ++j) rank_for[row_of[j] - 1] = j - 1;
  }

  // Each non-empty target block in order takes the free rank holding most of it (on a tie,
  // the one with the smaller block, then its own position, then the first), looking only at
  // ranks that hold part of it. Then each block still without a rank (empty, or no free rank
  // holds any of it) takes its own position if free, else the first free rank.
  static constexpr void greedy(const Layout& src, const Layout& dst, int* rank_for) {
    const int n = src.mesh().size();
    bool taken[max_relabel_ranks] = {};
    for (int q = 0; q < n; ++q) {
      rank_for[q] = -1;
      const Box want = box_at(dst, q);
      if (want.empty()) continue;
      int best = -1;
      std::int64_t most = 0, size = 0;
      if (!taken[q]) {
        const Box own = box_at(src, q);
        most = overlap_numel(own, want);
        size = own.numel();
        best = most > 0 ? q : -1;
      }
      if (best != q || most < want.numel() || size > most) {
        for_each_overlapping(src, want, [&](int p, std::int64_t o, std::int64_t s) {
          if (!taken[p] && (o > most || (o == most && s < size))) most = o, size = s, best = p;
        });
      }
      if (best < 0) continue;
      taken[best] = true;
      rank_for[q] = best;
    }
    int first_free = 0;
    for (int q = 0; q < n; ++q) {
      if (rank_for[q] >= 0) continue;
      if (taken[q]) {
        while (taken[first_free]) ++first_free;
        rank_for[q] = first_free;
      } else {
        rank_for[q] = q;
      }
      taken[rank_for[q]] = true;
    }
  }

  static constexpr Relabelling find(const Layout& src, const Layout& dst, RelabelMethod method) {
    check(src, dst);
    const int n = src.mesh().size();
    Relabelling r;
    r.size_ = n;
    for (int q = 0; q < n; ++q) r.rank_for_[q] = q;
    count(src, dst, r.rank_for_, r.recv_max_before_, r.recv_total_before_);
    r.method_ = method == RelabelMethod::automatic
                    ? (n <= max_exact_relabel_ranks ? RelabelMethod::exact : RelabelMethod::greedy)
                    : method;
    if (r.method_ == RelabelMethod::exact && n > max_exact_relabel_ranks)
      fail<why::relabel_exact_too_large>(max_exact_relabel_ranks, n);
    if (r.recv_total_before_ == 0) {
      // Already in place: the identity is optimal.
      r.recv_max_after_ = 0;
      r.recv_total_after_ = 0;
      return r;
    }
    if (r.method_ == RelabelMethod::exact)
      exact(src, dst, r.rank_for_);
    else
      greedy(src, dst, r.rank_for_);
    count(src, dst, r.rank_for_, r.recv_max_after_, r.recv_total_after_);
    if (r.recv_total_before_ <= r.recv_total_after_) {
      // Greedy can do worse than not relabelling at all (exact never does): keep the ranks.
      for (int q = 0; q < n; ++q) r.rank_for_[q] = q;
      r.recv_max_after_ = r.recv_max_before_;
      r.recv_total_after_ = r.recv_total_before_;
    }
    return r;
  }
};

}  // namespace detail

// The bytes the rank at position `rank` of src's mesh receives when it takes target block
// `block` (dst's block at that position): the elements of the block it does not hold.
constexpr std::int64_t relabel_bytes_recv(const Layout& src, const Layout& dst, int rank,
                                          int block) {
  detail::relabel_builder::check(src, dst);
  const int n = src.mesh().size();
  if (rank < 0 || rank >= n) detail::fail<detail::why::rank_out_of_mesh>(rank, n);
  if (block < 0 || block >= n) detail::fail<detail::why::rank_out_of_mesh>(block, n);
  const Box want = detail::box_at(dst, block);
  return (want.numel() - overlap_numel(detail::box_at(src, rank), want)) * src.elem_bytes();
}

// The relabelling of ranks that makes turning `src` into `dst` receive the fewest bytes in
// total (exact) or close to it (greedy), with the bytes before and after. The layouts may
// lie on meshes of different shapes with the same number of ranks (at most
// max_relabel_ranks); they must hold the same tensor (shape and dtype) and have no Partial
// placement, since a rank takes a whole block and a Partial block is not the value. Among
// optimal relabellings the exact method keeps as many ranks in place as it can, so layouts
// already in place keep the identity.
constexpr Relabelling find_relabelling(const Layout& src, const Layout& dst,
                                       RelabelMethod method = RelabelMethod::automatic) {
  return detail::relabel_builder::find(src, dst, method);
}

}  // namespace dtensor
