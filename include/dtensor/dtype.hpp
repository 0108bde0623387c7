#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "detail/why.hpp"
#include "errors.hpp"

namespace dtensor {

// The element type of a tensor.
enum class DType : std::uint8_t { f32, f64, f16, bf16, i32, i64, u8 };

// Every DType, in declaration order.
inline constexpr DType all_dtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                       DType::i32, DType::i64, DType::u8};

// Bytes per element.
constexpr std::size_t size_of(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  detail::fail<detail::why::bad_dtype>(static_cast<int>(t));
}

// The dtype's short spelling: "f32", "bf16", ...
constexpr std::string_view name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  detail::fail<detail::why::bad_dtype>(static_cast<int>(t));
}

// Whether the dtype holds floating-point values.
constexpr bool is_floating(DType t) noexcept {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

// IEEE half precision, as a storage type (16 bits, no arithmetic).
struct f16_t {
  std::uint16_t bits;
  friend constexpr bool operator==(f16_t, f16_t) noexcept = default;  // bitwise
};
// bfloat16, as a storage type (16 bits, no arithmetic).
struct bf16_t {
  std::uint16_t bits;
  friend constexpr bool operator==(bf16_t, bf16_t) noexcept = default;  // bitwise
};

// The DType of a C++ element type, for typed spans.
template <class T>
inline constexpr DType dtype_of = [] {
  static_assert(sizeof(T) == 0, "dtensor: no DType for this element type");
  return DType::f32;
}();
template <>
inline constexpr DType dtype_of<float> = DType::f32;
template <>
inline constexpr DType dtype_of<double> = DType::f64;
template <>
inline constexpr DType dtype_of<f16_t> = DType::f16;
template <>
inline constexpr DType dtype_of<bf16_t> = DType::bf16;
template <>
inline constexpr DType dtype_of<std::int32_t> = DType::i32;
template <>
inline constexpr DType dtype_of<std::int64_t> = DType::i64;
template <>
inline constexpr DType dtype_of<std::uint8_t> = DType::u8;

}  // namespace dtensor
