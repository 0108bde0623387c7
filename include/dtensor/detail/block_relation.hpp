#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <type_traits>

#include "../config.hpp"
#include "../layout.hpp"

// Ranks whose blocks under two layouts relate alike: an exchange between the layouts costs
// them the same, and they lack the same number of elements, so the planner costs one rank of
// each kind instead of every rank.
namespace dtensor::detail {

// Between two even layouts (every cut exact) whose cuts nest along every tensor dim (each
// piece size of either layout, the sizes cut on the way included, divides every larger one),
// a position along a tensor dim is a number whose digits are those cuts. Two pieces of the
// nested cuts either nest or are disjoint, and which depends only on whether the digits they
// both have agree. A rank's pieces under the two layouts, and the pieces its outer mesh dims
// cut on the way, therefore meet as the agreements of its pieces' shared digits say: key()
// packs them, one bit per digit that both of its pieces have. Ranks with equal keys receive
// and send as many elements in as many messages over the same links in an exchange between
// the layouts (exchange_cost), and lack as many elements (missing_elements). `usable` is
// false where a layout is uneven, a tensor dim is empty, the cuts do not nest, or the key
// needs more than max_digits bits.
// NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): arrays written by block_relation
struct BlockRelation {
  static constexpr int max_digits = 32;
  bool usable = false;
  int mesh_ndim = 0;
  // Per mesh dim: the tensor dim its shard cuts before and after (-1: none), and how far its
  // coordinate moves the rank's piece of that dim. (No initializers: a relation that is not
  // built costs nothing; block_relation writes every entry.)
  int dim_before[max_mesh_dims];
  int dim_after[max_mesh_dims];
  std::int64_t stride_before[max_mesh_dims];
  std::int64_t stride_after[max_mesh_dims];
  // Per mesh dim: ranks whose coordinates there differ only by less than this (a divisor of
  // the dim's size) relate alike, all else equal: the lower part of the coordinate moves the
  // rank's pieces by less than the finest digit compared.
  int step[max_mesh_dims];
  // The digits compared: each one's tensor dim, the piece size it counts in, and its values.
  int digits = 0;
  int digit_dim[max_digits];
  std::int64_t digit_unit[max_digits];
  std::int64_t digit_radix[max_digits];

  // The agreements of the digits of the rank at `c` (see above).
  [[nodiscard]] constexpr std::uint64_t key(const MeshCoord& c) const noexcept {
    std::int64_t before[max_tensor_dims] = {}, after[max_tensor_dims] = {};
    for (int k = 0; k < mesh_ndim; ++k) {
      if (dim_before[k] >= 0) before[dim_before[k]] += c[k] * stride_before[k];
      if (dim_after[k] >= 0) after[dim_after[k]] += c[k] * stride_after[k];
    }
    std::uint64_t out = 0;
    for (int i = 0; i < digits; ++i) {
      const int d = digit_dim[i];
      const std::int64_t unit = digit_unit[i], radix = digit_radix[i];
      const bool agree = before[d] / unit % radix == after[d] / unit % radix;
      out |= (agree ? std::uint64_t{1} : std::uint64_t{0}) << i;
    }
    return out;
  }
};

// The relation between every rank's blocks under placements `before` and `after` of `base`'s
// tensor and mesh (see BlockRelation).
constexpr BlockRelation block_relation(const Layout& base, const Placements& before,
                                       const Placements& after) {
  BlockRelation rel{};
  const DeviceMesh& mesh = base.mesh();
  const int n = mesh.ndim(), nd = base.tensor_ndim();
  rel.mesh_ndim = n;
  // Per tensor dim: every piece size either side cuts on the way (the extent first).
  constexpr int max_sizes = 2 * max_mesh_dims + 1;
  std::int64_t sizes[max_tensor_dims][max_sizes] = {};
  int count[max_tensor_dims] = {};
  std::int64_t piece_before[max_tensor_dims] = {}, piece_after[max_tensor_dims] = {};
  for (int d = 0; d < nd; ++d) {
    const std::int64_t extent = base.global_shape()[d];
    if (extent <= 0) return rel;
    piece_before[d] = piece_after[d] = extent;
    sizes[d][count[d]++] = extent;
  }
  auto cut = [&](const Placement& p, int g, int& dim, std::int64_t& stride, std::int64_t* piece) {
    dim = p.is_shard() ? p.dim() : -1;
    if (dim < 0) return true;
    if (piece[dim] % g != 0) return false;
    piece[dim] /= g;
    stride = piece[dim];
    sizes[dim][count[dim]++] = piece[dim];
    return true;
  };
  for (int k = 0; k < n; ++k) {
    const int g = mesh.size(k);
    if (!cut(before[k], g, rel.dim_before[k], rel.stride_before[k], piece_before) ||
        !cut(after[k], g, rel.dim_after[k], rel.stride_after[k], piece_after))
      return rel;
  }
  for (int d = 0; d < nd; ++d) {
    std::int64_t* s = sizes[d];
    // Largest first, each dividing the one before.
    std::sort(s, s + count[d], std::greater<>());
    const std::int64_t finest = piece_before[d] > piece_after[d] ? piece_before[d] : piece_after[d];
    std::int64_t larger = s[0];
    for (int i = 1; i < count[d]; ++i) {
      if (s[i] == larger) continue;
      if (larger % s[i] != 0) return rel;
      // A digit both pieces have: the piece size it counts in is no finer than either piece.
      if (s[i] >= finest) {
        if (rel.digits == BlockRelation::max_digits) return rel;
        rel.digit_dim[rel.digits] = d;
        rel.digit_unit[rel.digits] = s[i];
        rel.digit_radix[rel.digits] = larger / s[i];
        ++rel.digits;
      }
      larger = s[i];
    }
  }
  // The finest digit compared along each tensor dim decides how much of each coordinate counts.
  std::int64_t finest_digit[max_tensor_dims] = {};
  for (int i = 0; i < rel.digits; ++i) finest_digit[rel.digit_dim[i]] = rel.digit_unit[i];
  auto counts_below = [&](int dim, std::int64_t stride, int g) -> std::int64_t {
    if (dim < 0 || finest_digit[dim] == 0) return g;  // moves no digit compared
    if (finest_digit[dim] < stride) return 1;
    const std::int64_t q = finest_digit[dim] / stride;
    return q < g ? q : g;
  };
  for (int k = 0; k < n; ++k) {
    const int g = mesh.size(k);
    rel.step[k] =
        static_cast<int>(std::gcd(counts_below(rel.dim_before[k], rel.stride_before[k], g),
                                  counts_below(rel.dim_after[k], rel.stride_after[k], g)));
  }
  rel.usable = true;
  return rel;
}

// Values remembered per key (BlockRelation::key), the first `capacity` keys only. Only the
// entries remembered are ever read.
template <class V, int capacity = 32>
// NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): entries written before read
struct KeyedMemo {
  static_assert(std::is_trivially_default_constructible_v<V>, "a memo initializes nothing");
  int size = 0;
  std::uint64_t keys[capacity];
  V values[capacity];

  // The value remembered for `key`, or null.
  [[nodiscard]] constexpr const V* find(std::uint64_t key) const noexcept {
    for (int i = 0; i < size; ++i)
      if (keys[i] == key) return &values[i];
    return nullptr;
  }
  constexpr void remember(std::uint64_t key, const V& value) noexcept {
    if (size == capacity) return;
    keys[size] = key;
    values[size] = value;
    ++size;
  }
  // The value remembered for `key`; else compute(), remembered.
  template <class Compute>
  constexpr V value(std::uint64_t key, Compute&& compute) {
    if (const V* known = find(key)) return *known;
    const V v = compute();
    remember(key, v);
    return v;
  }
};

}  // namespace dtensor::detail
