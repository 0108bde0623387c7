#pragma once

#include <cstdint>

#include "../errors.hpp"
#include "why.hpp"

namespace dtensor::detail {

// a * b, or the error Why (by default: the tensor's size overflows) when it does not fit in 64
// bits.
template <class Why = why::size_overflow>
constexpr std::int64_t checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) fail<Why>();
  return out;
}

// a + b, or the error Why when it does not fit in 64 bits.
template <class Why = why::size_overflow>
constexpr std::int64_t checked_add(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) fail<Why>();
  return out;
}

// The same for the byte counts of a plan, which can exceed the tensor's size (copies to many
// ranks, the two phases of an all-reduce, sums over steps).
constexpr std::int64_t bytes_mul(std::int64_t a, std::int64_t b) {
  return checked_mul<why::bytes_overflow>(a, b);
}
constexpr std::int64_t bytes_add(std::int64_t a, std::int64_t b) {
  return checked_add<why::bytes_overflow>(a, b);
}

}  // namespace dtensor::detail
