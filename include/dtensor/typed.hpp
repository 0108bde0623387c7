#pragma once

#include <cstdint>
#include <type_traits>

#include "config.hpp"
#include "device_mesh.hpp"
#include "dtype.hpp"
#include "layout.hpp"
#include "placement.hpp"

// The typed front end: meshes, shapes and layouts whose sizes and placements are template
// arguments, folding at compile time to the same DeviceMesh, Shape and Layout values the
// planner takes (the static/dynamic split of CuTe's Int<N> and int).
namespace dtensor {

namespace detail {
template <class P>
struct is_static_placement : std::false_type {};
template <int D>
struct is_static_placement<Shard<D>> : std::bool_constant<D != dynamic_dim> {};
template <>
struct is_static_placement<Replicate> : std::true_type {};
template <ReduceOp Op>
struct is_static_placement<Partial<Op>> : std::bool_constant<Op != dynamic_reduce_op> {};
}  // namespace detail

// A placement spelled as a type: Shard<0>, Replicate, Partial<ReduceOp::max>.
template <class P>
concept StaticPlacement = detail::is_static_placement<P>::value;

// A mesh whose extents are template arguments: StaticMesh<2, 4>.
template <int... Extents>
struct StaticMesh {
  static_assert(sizeof...(Extents) >= 1, "dtensor: a mesh needs at least 1 dim");
  static_assert(sizeof...(Extents) <= max_mesh_dims, "dtensor: a mesh has at most 8 dims");
  static_assert(((Extents >= 1) && ...), "dtensor: mesh extents must be at least 1");

  static constexpr int ndim = sizeof...(Extents);
  static constexpr int size = (Extents * ...);

  static constexpr DeviceMesh value() { return DeviceMesh({Extents...}); }
  constexpr operator DeviceMesh() const { return value(); }  // NOLINT(google-explicit-constructor)
};

// A tensor shape whose sizes are template arguments: StaticShape<1024, 4096>.
template <std::int64_t... Dims>
struct StaticShape {
  static_assert(sizeof...(Dims) <= max_tensor_dims, "dtensor: a tensor has at most 8 dims");
  static_assert(((Dims >= 0) && ...), "dtensor: tensor sizes must not be negative");

  static constexpr int ndim = sizeof...(Dims);
  static constexpr Shape value() { return Shape{Dims...}; }
};

// The placements spelled by types, one per mesh dim: placements_v<Shard<0>, Replicate>.
template <StaticPlacement... Ps>
inline constexpr Placements placements_v = Placements{Placement(Ps{})...};

// A layout fixed entirely at compile time: element type, mesh, shape and one placement type
// per mesh dim. Invalid combinations fail to compile with the same reason the run-time path
// reports.
template <class T, class Mesh, class ShapeT, StaticPlacement... Ps>
struct StaticLayout {
  static_assert(sizeof...(Ps) == Mesh::ndim, "dtensor: one placement per mesh dim");
  static constexpr Layout value =
      Layout(Mesh::value(), placements_v<Ps...>, ShapeT::value(), dtype_of<T>);
};

// The Layout value of a StaticLayout.
template <class T, class Mesh, class ShapeT, StaticPlacement... Ps>
inline constexpr Layout static_layout_v = StaticLayout<T, Mesh, ShapeT, Ps...>::value;

}  // namespace dtensor
