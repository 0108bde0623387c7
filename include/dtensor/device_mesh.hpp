#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "config.hpp"
#include "detail/fixed_string.hpp"
#include "detail/static_vector.hpp"
#include "detail/why.hpp"
#include "errors.hpp"

namespace dtensor {

// A rank's position on a mesh: one coordinate per mesh dim.
using MeshCoord = detail::static_vector<int, max_mesh_dims>;
// The extents of a mesh, one per mesh dim.
using MeshShape = detail::static_vector<int, max_mesh_dims>;

// The ranks of a mesh that differ only in the coordinate of one mesh dim: the set that one
// communicator of that dim spans. Ranks are first + i * stride for i in [0, size).
struct MeshGroup {
  int first = 0;
  int stride = 1;
  int size = 1;
  // This rank's position in the group (its coordinate on the group's mesh dim).
  int index = 0;

  // The i-th rank of the group.
  [[nodiscard]] constexpr int rank(int i) const noexcept { return first + i * stride; }
  friend constexpr bool operator==(const MeshGroup&, const MeshGroup&) noexcept = default;
};

// An N-D grid of ranks (N <= max_mesh_dims), row-major, with optional dim names. A mesh maps
// coordinates to global ranks as offset + sum(coord[i] * stride[i]); a fresh mesh holds ranks
// 0..size()-1, and a sub-mesh keeps the strides of the mesh it was cut from.
class DeviceMesh {
 public:
  using Name = detail::fixed_string<max_dim_name_length>;

 private:
  // Defined before the constructors that call it: clang 14 cannot evaluate a member template
  // defined later in the class in a constant expression.
  template <class It>
  constexpr void set_names(It first, std::size_t count) {
    if (count == 0) return;
    if (count != extents_.size())
      detail::fail<detail::why::mesh_name_count>(extents_.size(), extents_.size(), count);
    for (std::size_t i = 0; i < count; ++i, ++first) {
      const std::string_view n = *first;
      if (n.empty() || n.size() > max_dim_name_length)
        detail::fail<detail::why::mesh_name_bad>(n, max_dim_name_length);
      for (std::size_t j = 0; j < i; ++j)
        if (names_[j].view() == n) detail::fail<detail::why::mesh_name_repeated>(n);
      names_[i] = Name(n);
    }
  }

 public:
  // One rank, one dim.
  constexpr DeviceMesh() : DeviceMesh(MeshShape{1}) {}
  constexpr explicit DeviceMesh(std::initializer_list<int> extents)
      : DeviceMesh(MeshShape(extents)) {}
  constexpr DeviceMesh(std::initializer_list<int> extents,
                       std::initializer_list<std::string_view> names)
      : DeviceMesh(MeshShape(extents)) {
    set_names(names.begin(), names.size());
  }
  constexpr explicit DeviceMesh(const MeshShape& extents) {
    if (extents.empty()) detail::fail<detail::why::mesh_no_dims>();
    std::int64_t total = 1;
    for (std::size_t i = 0; i < extents.size(); ++i) {
      if (extents[i] < 1) detail::fail<detail::why::mesh_bad_extent>(i, extents[i]);
      total *= extents[i];
      if (total > INT32_MAX) detail::fail<detail::why::mesh_too_large>(extents.size());
    }
    extents_ = extents;
    strides_.resize(extents.size());
    int stride = 1;
    for (std::size_t i = extents.size(); i-- > 0;) {
      strides_[i] = stride;
      stride *= extents[i];
    }
    size_ = static_cast<int>(total);
  }
  // A mesh with names; `names` holds ndim() entries (or none).
  template <class Names>
  constexpr DeviceMesh(const MeshShape& extents, const Names& names) : DeviceMesh(extents) {
    set_names(names.begin(), names.size());
  }

  [[nodiscard]] constexpr int ndim() const noexcept { return static_cast<int>(extents_.size()); }
  // Number of ranks.
  [[nodiscard]] constexpr int size() const noexcept { return size_; }
  // Extent of mesh dim `dim`.
  [[nodiscard]] constexpr int size(int dim) const { return extents_[checked_dim(dim)]; }
  [[nodiscard]] constexpr const MeshShape& shape() const noexcept { return extents_; }
  [[nodiscard]] constexpr bool has_names() const noexcept { return !names_[0].empty(); }
  // The name of mesh dim `dim` ("" when unnamed).
  [[nodiscard]] constexpr std::string_view name(int dim) const {
    return names_[checked_dim(dim)].view();
  }
  // The mesh dim called `name`.
  [[nodiscard]] constexpr int dim(std::string_view name) const {
    if (!has_names()) detail::fail<detail::why::mesh_unnamed>(name);
    for (int i = 0; i < ndim(); ++i)
      if (names_[i].view() == name) return i;
    detail::fail<detail::why::mesh_name_unknown>(name);
  }
  // The global rank of the mesh's first coordinate.
  [[nodiscard]] constexpr int first_rank() const noexcept { return offset_; }
  // How far apart in global ranks two neighbours along mesh dim `dim` are.
  [[nodiscard]] constexpr int stride(int dim) const { return strides_[checked_dim(dim)]; }

  // Whether global rank `rank` belongs to this mesh.
  // NOLINTNEXTLINE(bugprone-exception-escape): decompose cannot throw, see there
  [[nodiscard]] constexpr bool contains(int rank) const noexcept {
    MeshCoord c;
    return decompose(rank, c);
  }
  // The coordinate of global rank `rank`.
  [[nodiscard]] constexpr MeshCoord coordinate(int rank) const {
    MeshCoord c;
    if (!decompose(rank, c)) detail::fail<detail::why::rank_out_of_mesh>(rank, size_);
    return c;
  }
  // The global rank at coordinate `coord`.
  [[nodiscard]] constexpr int rank(const MeshCoord& coord) const {
    check_coord(coord);
    int r = offset_;
    for (int i = 0; i < ndim(); ++i) r += coord[i] * strides_[i];
    return r;
  }
  // The global rank of the i-th rank in row-major order (i in [0, size())).
  [[nodiscard]] constexpr int rank_at(int i) const {
    if (i < 0 || i >= size_) detail::fail<detail::why::rank_out_of_mesh>(i, size_);
    int r = offset_;
    for (int d = ndim(); d-- > 0;) {
      r += (i % extents_[d]) * strides_[d];
      i /= extents_[d];
    }
    return r;
  }
  // The position in row-major order (0..size()-1) of global rank `rank`.
  [[nodiscard]] constexpr int index_of(int rank) const { return index(coordinate(rank)); }
  // The coordinate of the i-th rank in row-major order: coordinate(rank_at(i)).
  [[nodiscard]] constexpr MeshCoord coordinate_at(int i) const {
    if (i < 0 || i >= size_) detail::fail<detail::why::rank_out_of_mesh>(i, size_);
    MeshCoord c(static_cast<std::size_t>(ndim()), 0);
    for (int d = ndim(); d-- > 0;) {
      c[d] = i % extents_[d];
      i /= extents_[d];
    }
    return c;
  }
  // The position in row-major order of coordinate `coord`: index_of(rank(coord)).
  [[nodiscard]] constexpr int index(const MeshCoord& coord) const {
    check_coord(coord);
    int i = 0;
    for (int d = 0; d < ndim(); ++d) i = i * extents_[d] + coord[d];
    return i;
  }

  // The group along mesh dim `dim` that holds global rank `rank`.
  [[nodiscard]] constexpr MeshGroup group(int rank, int dim) const {
    const int d = checked_dim(dim);
    const MeshCoord c = coordinate(rank);
    return MeshGroup{rank - c[d] * strides_[d], strides_[d], extents_[d], c[d]};
  }

  // The sub-mesh over the dims named in `names` (in the mesh's order) that holds global rank
  // `rank`: PyTorch's mesh["dp", "tp"] as seen from that rank.
  [[nodiscard]] constexpr DeviceMesh submesh(std::initializer_list<std::string_view> names,
                                             int rank) const {
    bool keep[max_mesh_dims] = {};
    for (std::string_view n : names) keep[dim(n)] = true;
    const MeshCoord c = coordinate(rank);
    DeviceMesh out;
    out.extents_.clear();
    out.strides_.clear();
    out.offset_ = offset_;
    out.size_ = 1;
    std::size_t kept = 0;
    for (int d = 0; d < ndim(); ++d) {
      if (keep[d]) {
        out.extents_.push_back(extents_[d]);
        out.strides_.push_back(strides_[d]);
        out.names_[kept++] = names_[d];
        out.size_ *= extents_[d];
      } else {
        out.offset_ += c[d] * strides_[d];
      }
    }
    return out;
  }

  friend constexpr bool operator==(const DeviceMesh& a, const DeviceMesh& b) noexcept {
    if (!(a.extents_ == b.extents_) || !(a.strides_ == b.strides_) || a.offset_ != b.offset_)
      return false;
    for (std::size_t i = 0; i < a.extents_.size(); ++i)
      if (!(a.names_[i] == b.names_[i])) return false;
    return true;
  }

 private:
  [[nodiscard]] constexpr int checked_dim(int dim) const {
    if (dim < 0 || dim >= ndim()) detail::fail<detail::why::mesh_dim_out_of_range>(dim, ndim());
    return dim;
  }
  // Fails unless `coord` has one coordinate per mesh dim, each within its extent.
  constexpr void check_coord(const MeshCoord& coord) const {
    if (static_cast<int>(coord.size()) != ndim())
      detail::fail<detail::why::coord_size_mismatch>(coord.size(), ndim());
    for (int d = 0; d < ndim(); ++d)
      if (coord[d] < 0 || coord[d] >= extents_[d])
        detail::fail<detail::why::coord_out_of_range>(coord[d], d, extents_[d]);
  }

  // Splits rank - offset into coordinates, dims in decreasing stride order (the mesh's order).
  // MeshCoord holds as many dims as any mesh has: resizing `c` to this mesh's cannot throw.
  // NOLINTNEXTLINE(bugprone-exception-escape): cannot throw, see above
  constexpr bool decompose(int rank, MeshCoord& c) const noexcept {
    std::int64_t rest = static_cast<std::int64_t>(rank) - offset_;
    if (rest < 0) return false;
    c.resize(extents_.size());
    for (std::size_t i = 0; i < extents_.size(); ++i) {
      const std::int64_t q = rest / strides_[i];
      if (q >= extents_[i]) return false;
      c[i] = static_cast<int>(q);
      rest -= q * strides_[i];
    }
    return rest == 0;
  }

  MeshShape extents_;
  MeshShape strides_;
  Name names_[max_mesh_dims];
  int offset_ = 0;
  int size_ = 1;
};

}  // namespace dtensor
