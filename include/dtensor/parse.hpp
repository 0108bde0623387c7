#pragma once

#include <cstdint>
#include <string_view>

#include "detail/static_vector.hpp"
#include "detail/why.hpp"
#include "device_mesh.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "layout.hpp"
#include "placement.hpp"
#include "reduce_op.hpp"

// Reading the spellings the CLI and the docs use: placements "S(0)", "R", "P", "P(max)",
// lists "S(0),R", meshes "2x4", shapes "1024x4096", dtypes "bf16". All constexpr.
namespace dtensor {

namespace detail {

constexpr std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

constexpr char lower(char c) noexcept { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; }

constexpr bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

// An optionally signed decimal integer that fits in int64, or nothing.
constexpr bool parse_int(std::string_view s, std::int64_t& out) noexcept {
  s = trim(s);
  bool negative = false;
  if (!s.empty() && (s.front() == '-' || s.front() == '+')) {
    negative = s.front() == '-';
    s.remove_prefix(1);
  }
  if (s.empty() || s.size() > 18) return false;
  std::int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  out = negative ? -v : v;
  return true;
}

// Splits "name(arg)" into name and arg; a bare name has an empty arg and no parentheses.
constexpr bool split_call(std::string_view s, std::string_view& name, std::string_view& arg,
                          bool& has_parens) noexcept {
  const auto open = s.find('(');
  if (open == std::string_view::npos) {
    name = s;
    arg = {};
    has_parens = false;
    return true;
  }
  if (s.back() != ')') return false;
  name = trim(s.substr(0, open));
  arg = trim(s.substr(open + 1, s.size() - open - 2));
  has_parens = true;
  return true;
}

}  // namespace detail

// "sum", "avg", "max", "min", "product" (any case; "prod" and "mean" too).
constexpr ReduceOp parse_reduce_op(std::string_view text) {
  const std::string_view s = detail::trim(text);
  for (ReduceOp op : all_reduce_ops)
    if (detail::iequals(s, name(op))) return op;
  if (detail::iequals(s, "prod")) return ReduceOp::product;
  if (detail::iequals(s, "mean")) return ReduceOp::avg;
  detail::fail<detail::why::parse_reduce_op>(text);
}

// "f32", "f64", "f16", "bf16", "i32", "i64", "u8" (and the long names float32, bfloat16, ...).
constexpr DType parse_dtype(std::string_view text) {
  const std::string_view s = detail::trim(text);
  for (DType t : all_dtypes)
    if (detail::iequals(s, name(t))) return t;
  constexpr struct {
    std::string_view spelling;
    DType dtype;
  } aliases[] = {{"float32", DType::f32},   {"float", DType::f32},   {"float64", DType::f64},
                 {"double", DType::f64},    {"float16", DType::f16}, {"half", DType::f16},
                 {"bfloat16", DType::bf16}, {"int32", DType::i32},   {"int", DType::i32},
                 {"int64", DType::i64},     {"long", DType::i64},    {"uint8", DType::u8}};
  for (const auto& a : aliases)
    if (detail::iequals(s, a.spelling)) return a.dtype;
  detail::fail<detail::why::parse_dtype>(text);
}

// "S(0)", "Shard(-1)", "R", "Replicate()", "P", "P(max)", "Partial(sum)".
constexpr Placement parse_placement(std::string_view text) {
  const std::string_view s = detail::trim(text);
  if (s.empty()) detail::fail<detail::why::parse_empty>("placement");
  std::string_view name, arg;
  bool parens = false;
  if (!detail::split_call(s, name, arg, parens)) detail::fail<detail::why::parse_placement>(text);
  if (name == "S" || name == "Shard") {
    std::int64_t d = 0;
    if (arg.substr(0, 4) == "dim=") arg.remove_prefix(4);
    if (!parens || !detail::parse_int(arg, d)) detail::fail<detail::why::parse_placement>(text);
    if (d < -max_tensor_dims || d >= max_tensor_dims)
      detail::fail<detail::why::shard_dim_unrepresentable>(d, max_tensor_dims);
    return Placement::shard(static_cast<int>(d));
  }
  if (name == "R" || name == "Replicate") {
    if (!arg.empty()) detail::fail<detail::why::parse_placement>(text);
    return Placement::replicate();
  }
  if (name == "P" || name == "Partial") {
    if (arg.substr(0, 7) == "reduce_") arg.remove_prefix(7);
    return Placement::partial(arg.empty() ? ReduceOp::sum : parse_reduce_op(arg));
  }
  detail::fail<detail::why::parse_placement>(text);
}

// A comma-separated list, optionally in brackets: "S(0),R", "[Shard(0), Replicate()]".
constexpr Placements parse_placements(std::string_view text) {
  std::string_view s = detail::trim(text);
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  if (detail::trim(s).empty()) detail::fail<detail::why::parse_empty>("placement list");
  Placements out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    const char c = i < s.size() ? s[i] : ',';
    if (c == '(') ++depth;
    if (c == ')' && --depth < 0) detail::fail<detail::why::parse_placement>(s.substr(start));
    // The end closes the last item: an unclosed one is an error, not dropped.
    if (i == s.size() && depth != 0) detail::fail<detail::why::parse_placement>(s.substr(start));
    if (c == ',' && depth == 0) {
      if (out.full()) detail::fail<detail::why::mesh_too_many_dims>(max_mesh_dims, out.size() + 1);
      out.push_back(parse_placement(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  return out;
}

namespace detail {

// Sizes joined by 'x' ("2x4", "1024x4096"); `what` names the thing for errors.
template <class Vec, class TooMany>
constexpr Vec parse_extents(std::string_view text, const char* what, std::int64_t lowest) {
  const std::string_view s = trim(text);
  if (s.empty()) fail<why::parse_extents>(text, what);
  Vec out;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size() && s[i] != 'x' && s[i] != 'X' && s[i] != ',') continue;
    const std::string_view piece = s.substr(start, i - start);
    std::int64_t v = 0;
    if (!parse_int(piece, v)) {
      const std::string_view digits = trim(piece);
      if (digits.size() > 18 && digits.find_first_not_of("0123456789") == std::string_view::npos)
        fail<why::parse_number_too_long>(piece, text);
      fail<why::parse_number>(piece, text);
    }
    if (v < lowest) fail<why::parse_extents>(text, what);
    if (out.full()) fail<TooMany>(Vec::capacity(), out.size() + 1);
    out.push_back(static_cast<typename Vec::value_type>(v));
    start = i + 1;
  }
  return out;
}

}  // namespace detail

// A mesh "2x4" (extents joined by 'x').
constexpr DeviceMesh parse_mesh(std::string_view text) {
  const auto extents = detail::parse_extents<detail::static_vector<std::int64_t, max_mesh_dims>,
                                             detail::why::mesh_too_many_dims>(text, "a mesh", 1);
  MeshShape shape;
  for (std::int64_t e : extents) {
    if (e > INT32_MAX) detail::fail<detail::why::parse_extents>(text, "a mesh");
    shape.push_back(static_cast<int>(e));
  }
  return DeviceMesh(shape);
}

// A tensor shape "1024x4096" (sizes joined by 'x'; 0 is allowed).
constexpr Shape parse_shape(std::string_view text) {
  return detail::parse_extents<Shape, detail::why::tensor_too_many_dims>(text, "a shape", 0);
}

}  // namespace dtensor
