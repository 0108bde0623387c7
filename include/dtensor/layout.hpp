#pragma once

#include <array>
#include <cstdint>

#include "config.hpp"
#include "detail/checked.hpp"
#include "detail/static_vector.hpp"
#include "detail/why.hpp"
#include "device_mesh.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "placement.hpp"

namespace dtensor {

// The sizes of a tensor's dims (also used for offsets into it).
using Shape = detail::static_vector<std::int64_t, max_tensor_dims>;

// How a dim of n elements is cut into k pieces.
enum class ChunkPolicy : std::uint8_t {
  // torch.chunk: pieces of ceil(n/k), trailing pieces short or empty (5 over 4: 2, 2, 1, 0).
  torch_chunk,
  // Sizes differ by at most one, larger first (5 over 4: 2, 1, 1, 1).
  balanced,
};

// A half-open range [start, start + size) of one tensor dim.
struct Range {
  std::int64_t start = 0;
  std::int64_t size = 0;
  friend constexpr bool operator==(const Range&, const Range&) noexcept = default;
};

// The number of elements two ranges of the same dim share.
constexpr std::int64_t overlap_size(const Range& a, const Range& b) noexcept {
  const std::int64_t lo = a.start > b.start ? a.start : b.start;
  const std::int64_t hi_a = a.start + a.size, hi_b = b.start + b.size;
  const std::int64_t hi = hi_a < hi_b ? hi_a : hi_b;
  return hi > lo ? hi - lo : 0;
}

// Piece `j` of `n` elements cut into `k` pieces under `policy`.
constexpr Range chunk_range(std::int64_t n, int k, int j, ChunkPolicy policy) noexcept {
  if (policy == ChunkPolicy::balanced) {
    const std::int64_t base = n / k;
    const std::int64_t extra = n % k;
    return {j * base + (j < extra ? j : extra), base + (j < extra ? 1 : 0)};
  }
  const std::int64_t piece = (n + k - 1) / k;
  const std::int64_t start = j * piece < n ? j * piece : n;
  const std::int64_t end = start + piece < n ? start + piece : n;
  return {start, end - start};
}

// The largest piece of `n` cut into `k` under `policy`: what padding pads each piece to.
constexpr std::int64_t max_chunk(std::int64_t n, int k, ChunkPolicy policy) noexcept {
  return chunk_range(n, k, 0, policy).size;
}

// The number of elements two blocks of the same tensor share.
struct Box;
constexpr std::int64_t overlap_numel(const Box& a, const Box& b) noexcept;

// A rectangular block of the global tensor: where it starts and its size in every dim.
struct Box {
  Shape offset;
  Shape shape;

  // Elements in the block.
  [[nodiscard]] constexpr std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (std::int64_t s : shape) n *= s;
    return n;
  }
  [[nodiscard]] constexpr bool empty() const noexcept { return numel() == 0; }
  friend constexpr bool operator==(const Box&, const Box&) noexcept = default;
};

constexpr std::int64_t overlap_numel(const Box& a, const Box& b) noexcept {
  std::int64_t n = 1;
  for (std::size_t d = 0; d < a.shape.size(); ++d) {
    const std::int64_t shared = overlap_size({a.offset[d], a.shape[d]}, {b.offset[d], b.shape[d]});
    if (shared == 0) return 0;
    n *= shared;
  }
  return n;
}

// The box where two boxes of the same tensor overlap (an empty box when they don't).
constexpr Box intersect(const Box& a, const Box& b) noexcept {
  Box out = a;  // a's rank; every entry is overwritten below
  for (std::size_t d = 0; d < a.shape.size(); ++d) {
    const std::int64_t lo = a.offset[d] > b.offset[d] ? a.offset[d] : b.offset[d];
    const std::int64_t ha = a.offset[d] + a.shape[d];
    const std::int64_t hb = b.offset[d] + b.shape[d];
    const std::int64_t hi = ha < hb ? ha : hb;
    out.offset[d] = lo;
    out.shape[d] = hi > lo ? hi - lo : 0;
  }
  return out;
}

// How one tensor lies on a mesh: a placement per mesh dim, the global shape, the element type
// and the chunking policy. Every rank's block follows: mesh dims that shard the same tensor
// dim nest outermost first, as in PyTorch's DTensor. Partial and Replicate keep the full
// extent.
class Layout {
 public:
  // A scalar f32 replicated on a mesh of one rank: what arrays of layouts start as.
  constexpr Layout() : Layout(DeviceMesh(), {Placement::replicate()}, {}) {}
  constexpr Layout(const DeviceMesh& mesh, const Placements& placements, const Shape& shape,
                   DType dtype = DType::f32, ChunkPolicy policy = ChunkPolicy::torch_chunk)
      : mesh_(mesh), placements_(placements), shape_(shape), dtype_(dtype), policy_(policy) {
    if (static_cast<int>(placements.size()) != mesh.ndim())
      detail::fail<detail::why::placement_count_mismatch>(placements.size(), mesh.ndim());
    const int nd = static_cast<int>(shape.size());
    for (int d = 0; d < nd; ++d)
      if (shape[d] < 0) detail::fail<detail::why::negative_extent>(d, shape[d]);
    for (Placement& p : placements_) {
      if (p.is_partial(ReduceOp::avg) && !is_floating(dtype))
        detail::fail<detail::why::avg_needs_float>(name(dtype));
      if (!p.is_shard()) continue;
      const int d = p.dim();
      if (d < -nd || d >= nd) detail::fail<detail::why::shard_dim_out_of_range>(d, nd);
      if (d < 0) p = Placement::shard(d + nd);
    }
    global_bytes_ = detail::checked_mul(numel_of(shape), static_cast<std::int64_t>(size_of(dtype)));
  }

  [[nodiscard]] constexpr const DeviceMesh& mesh() const noexcept { return mesh_; }
  [[nodiscard]] constexpr const Placements& placements() const noexcept { return placements_; }
  [[nodiscard]] constexpr const Placement& placement(int mesh_dim) const {
    return placements_.at(static_cast<std::size_t>(mesh_dim));
  }
  [[nodiscard]] constexpr const Shape& global_shape() const noexcept { return shape_; }
  [[nodiscard]] constexpr DType dtype() const noexcept { return dtype_; }
  [[nodiscard]] constexpr ChunkPolicy policy() const noexcept { return policy_; }
  // Number of tensor dims.
  [[nodiscard]] constexpr int tensor_ndim() const noexcept {
    return static_cast<int>(shape_.size());
  }
  // The constructor computed global_bytes_ from both: numel_of and size_of cannot throw here.
  // NOLINTNEXTLINE(bugprone-exception-escape): cannot throw, see above
  [[nodiscard]] constexpr std::int64_t global_numel() const noexcept { return numel_of(shape_); }
  [[nodiscard]] constexpr std::int64_t global_bytes() const noexcept { return global_bytes_; }
  // NOLINTNEXTLINE(bugprone-exception-escape): cannot throw, see above
  [[nodiscard]] constexpr std::int64_t elem_bytes() const noexcept {
    return static_cast<std::int64_t>(size_of(dtype_));
  }

  // The block of the global tensor held by the rank at `coord`.
  [[nodiscard]] constexpr Box local_box(const MeshCoord& coord) const {
    return local_box(placements_, coord);
  }
  // The block the rank at `coord` would hold under other (valid, resolved) placements.
  [[nodiscard]] constexpr Box local_box(const Placements& placements,
                                        const MeshCoord& coord) const {
    check_cut(placements, coord, mesh_.ndim());
    Box box{zero_offsets_[shape_.size()], shape_};
    for (std::size_t k = 0; k < mesh_.shape().size(); ++k) cut_unchecked(box, placements, coord, k);
    return box;
  }
  // The block cut by the shards of mesh dims before `depth` only: the union of the blocks of
  // every rank that agrees with `coord` on those dims.
  [[nodiscard]] constexpr Box outer_box(const Placements& placements, const MeshCoord& coord,
                                        int depth) const {
    Box box;
    box.shape = shape_;
    box.offset.resize(shape_.size(), 0);
    check_cut(placements, coord, depth);
    for (int i = 0; i < depth; ++i)
      cut_unchecked(box, placements, coord, static_cast<std::size_t>(i));
    return box;
  }
  // Cuts `box` by the shard of mesh dim `mesh_dim` under `placements`, if any: one level of
  // outer_box's nesting (outer_box(ps, c, k + 1) is outer_box(ps, c, k) cut by mesh dim k).
  constexpr void cut(Box& box, const Placements& placements, const MeshCoord& coord,
                     int mesh_dim) const {
    if (mesh_dim < 0) detail::fail<detail::why::mesh_dim_out_of_range>(mesh_dim, mesh_.ndim());
    check_cut(placements, coord, mesh_dim + 1);
    cut_unchecked(box, placements, coord, static_cast<std::size_t>(mesh_dim));
  }
  // The block of the global tensor held by global rank `rank`.
  [[nodiscard]] constexpr Box local_box(int rank) const {
    return local_box(mesh_.coordinate(rank));
  }
  [[nodiscard]] constexpr Shape local_shape(int rank) const { return local_box(rank).shape; }
  // Where global rank `rank`'s block starts, as PyTorch's compute_local_shape_and_global_offset
  // reports it: local_box(rank).offset, except along a dim where the block is empty, where it is
  // that dim's global extent (local_box keeps an empty block where its piece starts in the
  // nesting: 10 columns over 2 x 4 ranks, (S(1), S(1)), give rank 3 offset 10 here, 5 there).
  [[nodiscard]] constexpr Shape global_offset(int rank) const {
    Box box = local_box(rank);
    for (std::size_t d = 0; d < shape_.size(); ++d)
      if (box.shape[d] == 0) box.offset[d] = shape_[d];
    return box.offset;
  }
  [[nodiscard]] constexpr std::int64_t local_numel(int rank) const {
    return local_box(rank).numel();
  }
  [[nodiscard]] constexpr std::int64_t local_bytes(int rank) const {
    return local_numel(rank) * elem_bytes();
  }
  // The largest local block over all ranks, in bytes: the origin's, since every cut's first
  // piece is its largest (max_chunk), nested cuts included.
  [[nodiscard]] constexpr std::int64_t max_local_bytes() const {
    return local_box(MeshCoord(mesh_.shape().size(), 0)).numel() * elem_bytes();
  }

  // This layout with other placements (same mesh, shape, dtype and policy).
  [[nodiscard]] constexpr Layout with_placements(const Placements& placements) const {
    return {mesh_, placements, shape_, dtype_, policy_};
  }

  friend constexpr bool operator==(const Layout& a, const Layout& b) noexcept {
    return a.mesh_ == b.mesh_ && a.placements_ == b.placements_ && a.shape_ == b.shape_ &&
           a.dtype_ == b.dtype_ && a.policy_ == b.policy_;
  }

 private:
  // Fails unless mesh dims 0 to depth - 1 exist and `placements` and `coord` have entries for
  // them.
  constexpr void check_cut(const Placements& placements, const MeshCoord& coord, int depth) const {
    const auto n = static_cast<std::size_t>(depth);
    if (n > mesh_.shape().size())
      detail::fail<detail::why::mesh_dim_out_of_range>(depth - 1, mesh_.ndim());
    if (n > placements.size())
      detail::fail<detail::why::index_out_of_range>(depth - 1, placements.size());
    if (n > coord.size()) detail::fail<detail::why::index_out_of_range>(depth - 1, coord.size());
  }
  // cut, with mesh dim k checked by check_cut.
  constexpr void cut_unchecked(Box& box, const Placements& placements, const MeshCoord& coord,
                               std::size_t k) const {
    const Placement& p = placements[k];
    if (!p.is_shard()) return;
    const auto d = static_cast<std::size_t>(p.dim());
    const Range r = chunk_range(box.shape[d], mesh_.shape()[k], coord[k], policy_);
    box.offset[d] += r.start;
    box.shape[d] = r.size;
  }

  // Offsets of zero, of 0 to max_tensor_dims dims: a box starts as a copy of one, no loop.
  static constexpr std::array<Shape, max_tensor_dims + 1> zero_offsets_ = [] {
    std::array<Shape, max_tensor_dims + 1> out;
    for (std::size_t n = 0; n < out.size(); ++n) out[n].resize(n, 0);
    return out;
  }();

  static constexpr std::int64_t numel_of(const Shape& s) {
    std::int64_t n = 1;
    for (std::int64_t e : s) n = detail::checked_mul(n, e);
    return n;
  }

  DeviceMesh mesh_;
  Placements placements_;
  Shape shape_;
  DType dtype_;
  ChunkPolicy policy_;
  std::int64_t global_bytes_ = 0;
};

}  // namespace dtensor
