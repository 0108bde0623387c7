#pragma once

#include <bit>
#include <cstdint>

#include "../dtype.hpp"

// Conversions between float and the 16-bit storage types, round to nearest even; f16 and
// bf16 arithmetic happens in float.
namespace dtensor::detail {

constexpr float to_float(bf16_t v) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(v.bits) << 16);
}

constexpr bf16_t to_bf16(float f) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<std::uint16_t>((u >> 16) | 0x40)};
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<std::uint16_t>((u + rounding) >> 16)};
}

constexpr float to_float(f16_t v) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(v.bits & 0x8000u) << 16;
  std::uint32_t exponent = (v.bits >> 10) & 0x1fu;
  std::uint32_t mantissa = v.bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // Subnormal: normalise.
    exponent = 127 - 15 + 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3ffu;
    return std::bit_cast<float>(sign | (exponent << 23) | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

constexpr f16_t to_f16(float f) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16_t{static_cast<std::uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return f16_t{static_cast<std::uint16_t>(sign | 0x7c00u)};  // Inf
  if (abs < 0x38800000u) {  // subnormal or zero in f16
    if (abs < 0x33000000u) return f16_t{sign};
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;  // 14 - (exponent - 127) + 13 - 1
    std::uint32_t half = mantissa >> (shift);
    const std::uint32_t rest = mantissa & ((1u << shift) - 1);
    const std::uint32_t midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u) != 0)) ++half;
    return f16_t{static_cast<std::uint16_t>(sign | half)};
  }
  std::uint32_t half = ((abs >> 13) - ((127 - 15) << 10));
  const std::uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u) != 0)) ++half;
  return f16_t{static_cast<std::uint16_t>(sign | half)};
}

}  // namespace dtensor::detail
