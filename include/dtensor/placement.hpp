#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "config.hpp"
#include "detail/static_vector.hpp"
#include "detail/why.hpp"
#include "errors.hpp"
#include "reduce_op.hpp"

namespace dtensor {

// How a tensor lies along one mesh dim: split along a tensor dim (Shard), the same on every
// rank of the group (Replicate), or a partial value the group reduces with an op (Partial).
class Placement {
 public:
  enum class Kind : std::uint8_t { replicate, shard, partial };

  // Replicate.
  constexpr Placement() noexcept = default;
  static constexpr Placement replicate() noexcept { return {}; }
  // Shard(dim); a negative dim counts from the end and is resolved by the layout.
  static constexpr Placement shard(int dim) {
    if (dim < -max_tensor_dims || dim >= max_tensor_dims)
      detail::fail<detail::why::shard_dim_unrepresentable>(dim, max_tensor_dims);
    Placement p;
    p.kind_ = Kind::shard;
    p.dim_ = static_cast<std::int8_t>(dim);
    return p;
  }
  static constexpr Placement partial(ReduceOp op = ReduceOp::sum) noexcept {
    Placement p;
    p.kind_ = Kind::partial;
    p.op_ = op;
    return p;
  }

  [[nodiscard]] constexpr Kind kind() const noexcept { return kind_; }
  [[nodiscard]] constexpr bool is_replicate() const noexcept { return kind_ == Kind::replicate; }
  [[nodiscard]] constexpr bool is_shard() const noexcept { return kind_ == Kind::shard; }
  [[nodiscard]] constexpr bool is_shard(int dim) const noexcept {
    return kind_ == Kind::shard && dim_ == dim;
  }
  [[nodiscard]] constexpr bool is_partial() const noexcept { return kind_ == Kind::partial; }
  [[nodiscard]] constexpr bool is_partial(ReduceOp op) const noexcept {
    return kind_ == Kind::partial && op_ == op;
  }
  // The tensor dim of a Shard.
  [[nodiscard]] constexpr int dim() const {
    if (kind_ != Kind::shard) detail::fail<detail::why::not_a_shard>(kind_name());
    return dim_;
  }
  // The op of a Partial (sum for the others, which carry none).
  [[nodiscard]] constexpr ReduceOp reduce_op() const noexcept { return op_; }

  friend constexpr bool operator==(const Placement&, const Placement&) noexcept = default;

  // A hash consistent with ==.
  [[nodiscard]] constexpr std::size_t hash() const noexcept {
    return (static_cast<std::size_t>(kind_) << 16) |
           (static_cast<std::size_t>(static_cast<std::uint8_t>(dim_)) << 8) |
           static_cast<std::size_t>(op_);
  }

 private:
  [[nodiscard]] constexpr const char* kind_name() const noexcept {
    return kind_ == Kind::replicate ? "Replicate" : "Partial";
  }

  Kind kind_ = Kind::replicate;
  std::int8_t dim_ = 0;
  ReduceOp op_ = ReduceOp::sum;
};

// One placement per mesh dim.
using Placements = detail::static_vector<Placement, max_mesh_dims>;

// The marker for a tensor dim chosen at run time in Shard<>.
inline constexpr int dynamic_dim = INT_MIN;
// The marker for an op chosen at run time in Partial<>.
inline constexpr ReduceOp dynamic_reduce_op = static_cast<ReduceOp>(UINT8_MAX);

// Shard(d) spells a placement chosen at run time; Shard<d> is a type fixed at compile time.
// Both convert to Placement.
template <int D = dynamic_dim>
struct Shard {
  int dim = D;
  constexpr Shard() noexcept requires(D != dynamic_dim) = default;
  constexpr Shard(int d) noexcept  // NOLINT(google-explicit-constructor): a spelling of Placement
      requires(D == dynamic_dim)
      : dim(d) {}
  constexpr operator Placement() const {  // NOLINT(google-explicit-constructor)
    return Placement::shard(dim);
  }
};
Shard(int)->Shard<>;

// Replicate() spells the Replicate placement; Replicate is also its compile-time type.
struct Replicate {
  constexpr operator Placement() const noexcept {  // NOLINT(google-explicit-constructor)
    return Placement::replicate();
  }
};

// Partial(op) spells a placement chosen at run time (sum by default); Partial<op> is a type.
template <ReduceOp Op = dynamic_reduce_op>
struct Partial {
  ReduceOp op = Op == dynamic_reduce_op ? ReduceOp::sum : Op;
  constexpr Partial() noexcept = default;
  constexpr Partial(ReduceOp o) noexcept  // NOLINT(google-explicit-constructor)
      requires(Op == dynamic_reduce_op)
      : op(o) {}
  constexpr operator Placement() const noexcept {  // NOLINT(google-explicit-constructor)
    return Placement::partial(op);
  }
};
Partial()->Partial<>;
Partial(ReduceOp)->Partial<>;

// Predicates as free functions, for generic code.
constexpr bool is_shard(const Placement& p) noexcept { return p.is_shard(); }
constexpr bool is_replicate(const Placement& p) noexcept { return p.is_replicate(); }
constexpr bool is_partial(const Placement& p) noexcept { return p.is_partial(); }

// Whether any placement is Partial.
constexpr bool has_partial(const Placements& ps) noexcept {
  return std::any_of(ps.begin(), ps.end(), [](const Placement& p) { return p.is_partial(); });
}

}  // namespace dtensor

template <>
struct std::hash<dtensor::Placement> {
  std::size_t operator()(const dtensor::Placement& p) const noexcept { return p.hash(); }
};
