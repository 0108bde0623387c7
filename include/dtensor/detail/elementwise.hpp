#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../dtype.hpp"
#include "../reduce_op.hpp"
#include "half.hpp"

// Element-level operations on host memory for every dtype: reductions (f16 and bf16 in
// float), the identity of each op, scaling.
namespace dtensor::detail {

// Calls f.template operator()<T>() with the C++ element type of `t`.
template <class F>
constexpr decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<f16_t>();
    case DType::bf16: return f.template operator()<bf16_t>();
    case DType::i32: return f.template operator()<std::int32_t>();
    case DType::i64: return f.template operator()<std::int64_t>();
    case DType::u8: return f.template operator()<std::uint8_t>();
  }
  return f.template operator()<float>();
}

// A small index per C++ element type (float 0, double 1, int32 2, int64 3, uint8 4), for tables.
template <class C>
constexpr int dtype_index() noexcept {
  if constexpr (std::is_same_v<C, float>)
    return 0;
  else if constexpr (std::is_same_v<C, double>)
    return 1;
  else if constexpr (std::is_same_v<C, std::int32_t>)
    return 2;
  else if constexpr (std::is_same_v<C, std::int64_t>)
    return 3;
  else
    return 4;
}

// The type arithmetic happens in: float for the 16-bit types, the type itself otherwise.
template <class T>
using compute_t =
    std::conditional_t<std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>, float, T>;

template <class T>
constexpr compute_t<T> widen(T v) noexcept {
  if constexpr (std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>)
    return to_float(v);
  else
    return v;
}

template <class T>
constexpr T narrow(compute_t<T> v) noexcept {
  if constexpr (std::is_same_v<T, f16_t>)
    return to_f16(v);
  else if constexpr (std::is_same_v<T, bf16_t>)
    return to_bf16(v);
  else
    return static_cast<T>(v);
}

// a + b; integers saturate at their limits instead of overflowing (undefined for signed
// types), which also keeps a max's or min's identity (the lowest or highest value) out of reach
// of real values when a block filled with it is later summed.
template <class C>
constexpr C add(C a, C b) noexcept {
  // Plain comparisons, no overflow builtins: the same code runs in CUDA kernels.
  if constexpr (std::is_integral_v<C>) {
    if (b > 0 && a > std::numeric_limits<C>::max() - b) return std::numeric_limits<C>::max();
    if constexpr (std::is_signed_v<C>)
      if (b < 0 && a < std::numeric_limits<C>::lowest() - b)
        return std::numeric_limits<C>::lowest();
    return static_cast<C>(a + b);
  } else {
    return a + b;
  }
}

// a * b; integers wrap (two's complement) instead of overflowing.
template <class C>
constexpr C multiply(C a, C b) noexcept {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// Whether x is NaN: the one value unequal to itself (std::isnan is not constexpr in C++20).
template <class C>
constexpr bool is_nan(C x) noexcept {
  return x != x;  // NOLINT(misc-redundant-expression): the NaN test itself
}

// a op b, where avg accumulates as a sum (the caller divides once at the end). NaN
// propagates through max and min.
template <class C>
constexpr C combine(C a, C b, ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return add(a, b);
    case ReduceOp::product: return multiply(a, b);
    case ReduceOp::max:
      if constexpr (std::numeric_limits<C>::has_quiet_NaN)
        if (is_nan(a) || is_nan(b)) return is_nan(a) ? a : b;
      return a < b ? b : a;
    case ReduceOp::min:
      if constexpr (std::numeric_limits<C>::has_quiet_NaN)
        if (is_nan(a) || is_nan(b)) return is_nan(a) ? a : b;
      return b < a ? b : a;
  }
  return a;
}

// The value x with x op y == y for every y.
template <class T>
constexpr T identity(ReduceOp op) noexcept {
  using C = compute_t<T>;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return narrow<T>(C(0));
    case ReduceOp::product: return narrow<T>(C(1));
    case ReduceOp::max:
      return narrow<T>(std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                                            : std::numeric_limits<C>::lowest());
    case ReduceOp::min:
      return narrow<T>(std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity()
                                                            : std::numeric_limits<C>::max());
  }
  return T{};
}

// reduce_into for one op: a chunk of elements at a time, accumulated part after part in a
// small buffer, so that each pass is a plain loop the compiler vectorizes (the op's switch, and
// f16/bf16's conversions, out of the inner loop). Every element sees the same operations in the
// same order as one element at a time, so the results are bit-identical.
template <ReduceOp Op, class T>
void reduce_into(T* out, const T* const* in, int parts, std::size_t count) {
  using C = compute_t<T>;
  constexpr std::size_t chunk = 512;
  C acc[chunk];
  for (std::size_t at = 0; at < count; at += chunk) {
    const std::size_t n = count - at < chunk ? count - at : chunk;
    const T* first = in[0] + at;
    if (parts == 1) {
      for (std::size_t i = 0; i < n; ++i) acc[i] = widen(first[i]);
    } else {
      const T* second = in[1] + at;
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(widen(first[i]), widen(second[i]), Op);
    }
    for (int p = 2; p < parts; ++p) {
      const T* next = in[p] + at;
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], widen(next[i]), Op);
    }
    if constexpr (Op == ReduceOp::avg)
      for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<C>(acc[i] / static_cast<C>(parts));
    T* to = out + at;
    for (std::size_t i = 0; i < n; ++i) to[i] = narrow<T>(acc[i]);
  }
}

// out[i] = reduce over the `parts` inputs (in order) of in[p][i], for `count` elements; avg
// divides by the number of parts once at the end. The output may be one of the inputs.
template <class T>
void reduce_into(T* out, const T* const* in, int parts, std::size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return reduce_into<ReduceOp::sum>(out, in, parts, count);
    case ReduceOp::avg: return reduce_into<ReduceOp::avg>(out, in, parts, count);
    case ReduceOp::product: return reduce_into<ReduceOp::product>(out, in, parts, count);
    case ReduceOp::max: return reduce_into<ReduceOp::max>(out, in, parts, count);
    case ReduceOp::min: return reduce_into<ReduceOp::min>(out, in, parts, count);
  }
}

// Fills `count` elements with the identity of `op`.
template <class T>
void fill_identity(T* out, std::size_t count, ReduceOp op) {
  const T v = identity<T>(op);
  for (std::size_t i = 0; i < count; ++i) out[i] = v;
}

// Multiplies `count` elements by `g` (in float for f16 and bf16; integers saturate).
template <class T>
void multiply_by(T* data, std::size_t count, int g) {
  using C = compute_t<T>;
  for (std::size_t i = 0; i < count; ++i) {
    C acc = C(0);
    for (int j = 0; j < g; ++j) acc = add(acc, widen(data[i]));
    data[i] = narrow<T>(acc);
  }
}

// Divides `count` elements by `g` (in float for f16 and bf16).
template <class T>
void divide(T* data, std::size_t count, int g) {
  using C = compute_t<T>;
  for (std::size_t i = 0; i < count; ++i)
    data[i] = narrow<T>(static_cast<C>(widen(data[i]) / C(g)));
}

}  // namespace dtensor::detail
