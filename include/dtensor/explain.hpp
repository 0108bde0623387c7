#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "format.hpp"
#include "plan.hpp"

// Plans in words: explain(plan), the table the dtensor-plan tool prints.
namespace dtensor {

// "512 B", "1.50 KiB", "8.00 MiB".
inline std::string human_bytes(std::int64_t bytes) {
  constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  auto v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", v, units[u]);
}

// The plan as a table: one row per step with the mesh dim, placements, bytes per rank and
// estimated time, then the totals beside the lower bound.
inline std::string explain(const Plan& plan) {
  const Layout& src = plan.src();
  const DeviceMesh& mesh = src.mesh();
  std::string out = fmt::format("plan: {} -> {} on mesh {}, shape {} {} ({})\n", src.placements(),
                                plan.dst().placements(), mesh, src.global_shape(), src.dtype(),
                                human_bytes(src.global_bytes()));
  if (plan.empty()) return out + "  nothing to do: the layouts are equal\n";
  out += fmt::format("  {:>2}  {:<15} {:<9} {:<34} {:>12} {:>12} {:>10}\n", "#", "step", "mesh dim",
                     "placements", "recv max", "send max", "est");
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Step& s = plan[i];
    std::string dim = s.mesh_dim < 0 ? "all" : fmt::format("{}", s.mesh_dim);
    if (s.mesh_dim >= 0 && !mesh.name(s.mesh_dim).empty())
      dim += fmt::format(" ({})", mesh.name(s.mesh_dim));
    const std::string kind = fmt::format("{}{}", name(s.kind), s.padded ? "*" : "");
    out += fmt::format("  {:>2}  {:<15} {:<9} {:<34} {:>12} {:>12} {:>7.2f} us\n", i + 1, kind, dim,
                       fmt::format("{} -> {}", s.before, s.after), human_bytes(s.bytes_recv_max),
                       human_bytes(s.bytes_send_max), s.est_us);
  }
  bool padded = false;
  for (const Step& s : plan) padded |= s.padded;
  if (padded) out += "  * uneven pieces padded to the group's largest (counted in the bytes)\n";
  const std::int64_t bound = plan.lower_bound_bytes_recv_max();
  out += fmt::format("total: recv max {} ({} B), lower bound {} ({} B)",
                     human_bytes(plan.bytes_recv_max()), plan.bytes_recv_max(), human_bytes(bound),
                     bound);
  if (bound > 0)
    out += fmt::format(", ratio {:.2f}",
                       static_cast<double>(plan.bytes_recv_max()) / static_cast<double>(bound));
  out += fmt::format("; est {:.2f} us\n", plan.est_us());
  return out;
}

}  // namespace dtensor
