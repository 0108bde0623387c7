#pragma once

#include <array>
#include <cstddef>
#include <utility>

#include "config.hpp"
#include "device_mesh.hpp"

namespace dtensor {

// The alpha-beta cost of one link class: a message costs latency_us, and bytes flow at
// bandwidth_gbs (GB/s, 1e9 bytes per second).
struct LinkCost {
  double latency_us = 0;
  double bandwidth_gbs = 1;

  // Microseconds to move `bytes` in `messages` messages over this link.
  [[nodiscard]] constexpr double time_us(double messages, double bytes) const noexcept {
    return latency_us * messages + bytes / (bandwidth_gbs * 1e3);
  }
  friend constexpr bool operator==(const LinkCost&, const LinkCost&) noexcept = default;
};

// NVLink/NVSwitch inside a node, as NCCL sees it on H100-class machines.
inline constexpr LinkCost nvlink_like{2.0, 300.0};
// InfiniBand/RoCE between nodes (400 Gb/s NICs).
inline constexpr LinkCost network_like{8.0, 45.0};

namespace detail {
// LinkCost{} for each of the indices: every element spelt out (see CostModel::dims).
template <std::size_t... I>
constexpr std::array<LinkCost, sizeof...(I)> default_links(std::index_sequence<I...> /*dims*/) {
  return {((void)I, LinkCost{})...};
}
}  // namespace detail

// The cost of communication along each mesh dim. The planner estimates a collective on mesh
// dim k with dims[k]; a point-to-point message between two ranks with the link of the
// outermost mesh dim where their coordinates differ.
struct CostModel {
  // LinkCost{} (no latency, 1 GB/s) on every dim until set. Every element is spelt out: g++ 12
  // miscompiles `dims{}` (an array of a type with default member initializers, value-initialized)
  // in a translation unit that also evaluates CostModel::defaults at compile time: its later
  // run-time arrays come out zero-filled, bandwidth 0 (tests/constexpr_runtime_test.cpp).
  std::array<LinkCost, max_mesh_dims> dims =
      detail::default_links(std::make_index_sequence<max_mesh_dims>{});
  // A grouped point-to-point round pays this many times a collective's per-message latency
  // (NCCL and MPI have no variable-size all-gather or reduce-scatter; uneven exact steps and
  // exchanges are rounds of point-to-point messages).
  double p2p_latency_factor = 2.0;

  // Inner mesh dims NVLink-like while their ranks fit in one node of `ranks_per_node`,
  // outer dims network-like.
  static constexpr CostModel defaults(const DeviceMesh& mesh, int ranks_per_node = 8) {
    CostModel m;
    long long inner = 1;
    for (int k = mesh.ndim(); k-- > 0;) {
      inner *= mesh.size(k);
      m.dims[k] = inner <= ranks_per_node ? nvlink_like : network_like;
    }
    return m;
  }
  friend constexpr bool operator==(const CostModel&, const CostModel&) noexcept = default;
};

}  // namespace dtensor
