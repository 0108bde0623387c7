#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstddef>
#include <iterator>
#include <string_view>
#include <type_traits>

#include "detail/static_vector.hpp"
#include "device_mesh.hpp"
#include "dtype.hpp"
#include "layout.hpp"
#include "placement.hpp"
#include "plan.hpp"
#include "reduce_op.hpp"
#include "relabel.hpp"

// fmt formatters for every public value type, plans and steps included. The spellings are the ones
// parse.hpp reads: "S(0)", "R", "P(sum)", "bf16", "2x4". The only core header that includes fmt.
namespace dtensor::detail {

using text_buffer = fmt::memory_buffer;

inline void write(text_buffer& out, ReduceOp op) { out.append(name(op)); }
inline void write(text_buffer& out, DType t) { out.append(name(t)); }
inline void write(text_buffer& out, ChunkPolicy p) {
  out.append(std::string_view(p == ChunkPolicy::balanced ? "balanced" : "torch_chunk"));
}

// "S(0)", "R", "P(sum)".
inline void write(text_buffer& out, const Placement& p) {
  switch (p.kind()) {
    case Placement::Kind::replicate: out.push_back('R'); break;
    case Placement::Kind::shard: fmt::format_to(std::back_inserter(out), "S({})", p.dim()); break;
    case Placement::Kind::partial:
      fmt::format_to(std::back_inserter(out), "P({})", name(p.reduce_op()));
      break;
  }
}

// Placements, mesh coordinates and shapes: "[S(0), R]", "[0, 1]", "[1024, 4096]".
template <class T, std::size_t N>
void write(text_buffer& out, const static_vector<T, N>& v) {
  out.push_back('[');
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out.append(std::string_view(", "));
    if constexpr (std::is_same_v<T, Placement>)
      write(out, v[i]);
    else
      fmt::format_to(std::back_inserter(out), "{}", v[i]);
  }
  out.push_back(']');
}

// "2x4", or "2x4 (dp, tp)" with names.
inline void write(text_buffer& out, const DeviceMesh& m) {
  auto it = std::back_inserter(out);
  for (int i = 0; i < m.ndim(); ++i) fmt::format_to(it, "{}{}", i > 0 ? "x" : "", m.size(i));
  if (!m.has_names()) return;
  out.append(std::string_view(" ("));
  for (int i = 0; i < m.ndim(); ++i) fmt::format_to(it, "{}{}", i > 0 ? ", " : "", m.name(i));
  out.push_back(')');
}

// The ranks of a group and this rank's place in it: "{1, 5} (index 0)".
inline void write(text_buffer& out, const MeshGroup& g) {
  auto it = std::back_inserter(out);
  out.push_back('{');
  for (int i = 0; i < g.size; ++i) fmt::format_to(it, "{}{}", i > 0 ? ", " : "", g.rank(i));
  fmt::format_to(it, "}} (index {})", g.index);
}

// A block as slices: "[0:512, 0:4096]".
inline void write(text_buffer& out, const Box& b) {
  auto it = std::back_inserter(out);
  out.push_back('[');
  for (std::size_t d = 0; d < b.shape.size(); ++d)
    fmt::format_to(it, "{}{}:{}", d > 0 ? ", " : "", b.offset[d], b.offset[d] + b.shape[d]);
  out.push_back(']');
}

// "Layout(mesh 2x4, [S(0), R], shape [1024, 4096], bf16)".
inline void write(text_buffer& out, const Layout& l) {
  out.append(std::string_view("Layout(mesh "));
  write(out, l.mesh());
  out.append(std::string_view(", "));
  write(out, l.placements());
  out.append(std::string_view(", shape "));
  write(out, l.global_shape());
  out.append(std::string_view(", "));
  write(out, l.dtype());
  if (l.policy() == ChunkPolicy::balanced) out.append(std::string_view(", balanced"));
  out.push_back(')');
}

inline void write(text_buffer& out, StepKind k) { out.append(name(k)); }

// "all_gather on mesh dim 0: [S(0), R] -> [R, R]", with " (padded)" when it pads and " (by
// elements)" when an exchange from a Partial cuts its blocks so.
inline void write(text_buffer& out, const Step& s) {
  out.append(name(s.kind));
  if (s.mesh_dim >= 0)
    fmt::format_to(std::back_inserter(out), " on mesh dim {}", s.mesh_dim);
  else
    out.append(std::string_view(" across the mesh"));
  out.append(std::string_view(": "));
  write(out, s.before);
  out.append(std::string_view(" -> "));
  write(out, s.after);
  if (s.padded) out.append(std::string_view(" (padded)"));
  if (s.by_elements) out.append(std::string_view(" (by elements)"));
}

// "[S(0), R] -> [R, S(1)]: 1 steps, recv max 1048576 B, est 7.50 us".
inline void write(text_buffer& out, const Plan& p) {
  write(out, p.src().placements());
  out.append(std::string_view(" -> "));
  write(out, p.dst().placements());
  fmt::format_to(std::back_inserter(out), ": {} steps, recv max {} B, est {:.2f} us", p.size(),
                 p.bytes_recv_max(), p.est_us());
}

inline void write(text_buffer& out, RelabelMethod m) { out.append(name(m)); }

// "[0, 4, 1, 5] (exact): recv max 0 B, total 0 B (before: recv max 32 B, total 96 B)".
inline void write(text_buffer& out, const Relabelling& r) {
  auto it = std::back_inserter(out);
  out.push_back('[');
  for (int q = 0; q < r.size(); ++q) fmt::format_to(it, "{}{}", q > 0 ? ", " : "", r.rank_for(q));
  fmt::format_to(it, "] ({}): recv max {} B, total {} B (before: recv max {} B, total {} B)",
                 name(r.method()), r.bytes_recv_max_after(), r.bytes_recv_total_after(),
                 r.bytes_recv_max_before(), r.bytes_recv_total_before());
}

// Formats a value through write() and then fmt's string formatter, so width and alignment
// specs ("{:>8}") work for every type.
template <class T>
struct text_formatter : fmt::formatter<std::string_view> {
  template <class Context>
  auto format(const T& value, Context& ctx) const {
    text_buffer buf;
    write(buf, value);
    return fmt::formatter<std::string_view>::format(std::string_view(buf.data(), buf.size()), ctx);
  }
};

}  // namespace dtensor::detail

// Shapes, placement lists and plans are ranges too: fmt/ranges.h (which a program may include
// before or after dtensor) leaves them to the formatters below.
template <class T, std::size_t N>
struct fmt::range_format_kind<dtensor::detail::static_vector<T, N>, char>
    : std::integral_constant<fmt::range_format, fmt::range_format::disabled> {};
template <>
struct fmt::range_format_kind<dtensor::Plan, char>
    : std::integral_constant<fmt::range_format, fmt::range_format::disabled> {};

template <>
struct fmt::formatter<dtensor::ReduceOp> : dtensor::detail::text_formatter<dtensor::ReduceOp> {};
template <>
struct fmt::formatter<dtensor::DType> : dtensor::detail::text_formatter<dtensor::DType> {};
template <>
struct fmt::formatter<dtensor::ChunkPolicy>
    : dtensor::detail::text_formatter<dtensor::ChunkPolicy> {};
template <>
struct fmt::formatter<dtensor::Placement> : dtensor::detail::text_formatter<dtensor::Placement> {};
template <class T, std::size_t N>
struct fmt::formatter<dtensor::detail::static_vector<T, N>>
    : dtensor::detail::text_formatter<dtensor::detail::static_vector<T, N>> {};
template <>
struct fmt::formatter<dtensor::DeviceMesh> : dtensor::detail::text_formatter<dtensor::DeviceMesh> {
};
template <>
struct fmt::formatter<dtensor::MeshGroup> : dtensor::detail::text_formatter<dtensor::MeshGroup> {};
template <>
struct fmt::formatter<dtensor::Box> : dtensor::detail::text_formatter<dtensor::Box> {};
template <>
struct fmt::formatter<dtensor::Layout> : dtensor::detail::text_formatter<dtensor::Layout> {};
template <>
struct fmt::formatter<dtensor::StepKind> : dtensor::detail::text_formatter<dtensor::StepKind> {};
template <>
struct fmt::formatter<dtensor::Step> : dtensor::detail::text_formatter<dtensor::Step> {};
template <>
struct fmt::formatter<dtensor::Plan> : dtensor::detail::text_formatter<dtensor::Plan> {};
template <>
struct fmt::formatter<dtensor::RelabelMethod>
    : dtensor::detail::text_formatter<dtensor::RelabelMethod> {};
template <>
struct fmt::formatter<dtensor::Relabelling>
    : dtensor::detail::text_formatter<dtensor::Relabelling> {};
