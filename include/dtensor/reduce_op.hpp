#pragma once

#include <cstdint>
#include <string_view>

#include "detail/why.hpp"
#include "errors.hpp"

namespace dtensor {

// How the partial values of a Partial placement combine into the true value.
enum class ReduceOp : std::uint8_t { sum, avg, max, min, product };

// Every ReduceOp, in declaration order.
inline constexpr ReduceOp all_reduce_ops[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max,
                                              ReduceOp::min, ReduceOp::product};

// The op's spelling: "sum", "avg", "max", "min", "product".
constexpr std::string_view name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::product: return "product";
  }
  detail::fail<detail::why::bad_reduce_op>(static_cast<int>(op));
}

// Whether reducing the same value g times gives it back (max, min): then Replicate → Partial
// needs no scaling.
constexpr bool is_idempotent(ReduceOp op) noexcept {
  return op == ReduceOp::max || op == ReduceOp::min;
}

// Whether the op is linear (sum, avg), so that a plan over it has an adjoint.
constexpr bool is_linear(ReduceOp op) noexcept {
  return op == ReduceOp::sum || op == ReduceOp::avg;
}

// Whether reducing over two mesh dims with these ops gives the same in either order: the same
// op, or two linear ones.
constexpr bool ops_commute(ReduceOp a, ReduceOp b) noexcept {
  return a == b || (is_linear(a) && is_linear(b));
}

}  // namespace dtensor
