#pragma once

#include <cstdint>

#include "../errors.hpp"
#include "why.hpp"

namespace dtensor::detail {

// a * b, or a size_overflow error when it does not fit in 64 bits.
constexpr std::int64_t checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) fail<why::size_overflow>();
  return out;
}

// a + b, or a size_overflow error when it does not fit in 64 bits.
constexpr std::int64_t checked_add(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) fail<why::size_overflow>();
  return out;
}

}  // namespace dtensor::detail
