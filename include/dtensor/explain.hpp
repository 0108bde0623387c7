#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "batch_plan.hpp"
#include "format.hpp"
#include "plan.hpp"
#include "relabel.hpp"

// Plans in words: explain(plan), the table the dtensor-plan tool prints; describe(relabelling).
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
    const std::string kind = fmt::format("{}{}", name(s.kind),
                                         s.padded        ? "*"
                                         : s.by_elements ? "+"
                                                         : "");
    out += fmt::format("  {:>2}  {:<15} {:<9} {:<34} {:>12} {:>12} {:>7.2f} us\n", i + 1, kind, dim,
                       fmt::format("{} -> {}", s.before, s.after), human_bytes(s.bytes_recv_max),
                       human_bytes(s.bytes_send_max), s.est_us);
  }
  bool padded = false, by_elements = false;
  for (const Step& s : plan) {
    padded |= s.padded;
    by_elements |= s.by_elements;
  }
  if (padded) out += "  * uneven pieces padded to the group's largest (counted in the bytes)\n";
  if (by_elements)
    out += "  + each group's block split among its members by runs of its elements\n";
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

// A relabelling in one sentence: "relabel ranks as [3, 1, 2, 0] (target block q goes to rank
// [q]; exact) and this redistribution moves 0 B (before: 4.00 MiB max per rank, 12.00 MiB in
// all)". Lists at most 64 ranks.
inline std::string describe(const Relabelling& r) {
  const std::string before =
      fmt::format("{} max per rank, {} in all", human_bytes(r.bytes_recv_max_before()),
                  human_bytes(r.bytes_recv_total_before()));
  if (r.is_identity()) {
    if (r.moves_nothing()) return "keep the ranks: every rank already holds its target block";
    return fmt::format("keep the ranks ({}: no relabelling found receives fewer bytes): {}",
                       name(r.method()), before);
  }
  constexpr int listed = 64;
  std::string ranks = "[";
  for (int q = 0; q < r.size() && q < listed; ++q)
    ranks += fmt::format("{}{}", q > 0 ? ", " : "", r.rank_for(q));
  if (r.size() > listed) ranks += fmt::format(", ... {} more", r.size() - listed);
  ranks += "]";
  const std::string after = r.moves_nothing()
                                ? std::string("moves 0 B")
                                : fmt::format("receives {} max per rank, {} in all",
                                              human_bytes(r.bytes_recv_max_after()),
                                              human_bytes(r.bytes_recv_total_after()));
  return fmt::format(
      "relabel ranks as {} (target block q goes to rank [q]; {}) and this redistribution {} "
      "(before: {})",
      ranks, name(r.method()), after, before);
}

// The batched plan as a table: one row per round (its collective, the tensors it carries, the
// bytes of the busiest rank, the estimated time), then the totals against one by one.
template <std::size_t N>
std::string explain(const BatchPlan<N>& batch) {
  if (batch.empty()) return "batch: no tensors\n";
  const DeviceMesh& mesh = batch[0].src().mesh();
  std::string out = fmt::format("batch: {} tensors on mesh {}\n", batch.size(), mesh);
  for (std::size_t t = 0; t < batch.size(); ++t) {
    const Plan& p = batch[t];
    out += fmt::format("  tensor {:>2}: {} {} {} -> {}: {} steps, recv max {}, est {:.2f} us\n", t,
                       p.src().global_shape(), p.src().dtype(), p.src().placements(),
                       p.dst().placements(), p.size(), human_bytes(p.bytes_recv_max()), p.est_us());
  }
  if (batch.rounds().empty()) return out + "  nothing to move\n";
  out += fmt::format("  {:>5}  {:<18} {:<9} {:>7} {:>12} {:>10}\n", "round", "collective",
                     "mesh dim", "tensors", "recv max", "est");
  for (std::size_t r = 0; r < batch.rounds().size(); ++r) {
    const BatchRound& round = batch.rounds()[r];
    std::string what{name(round.kind)};
    if (round.kind == StepKind::exchange) what = "point-to-point";
    if (round.kind == StepKind::reduce_scatter || round.kind == StepKind::all_reduce)
      what += fmt::format(" {} {}", round.dtype, round.op);
    out += fmt::format("  {:>5}  {:<18} {:<9} {:>7} {:>12} {:>7.2f} us\n", r + 1, what,
                       round.mesh_dim < 0 ? std::string("all") : fmt::format("{}", round.mesh_dim),
                       round.tensors, human_bytes(round.bytes_recv_max), round.est_us);
  }
  out += fmt::format(
      "total: {} collectives (one by one: {}), recv max {}; est {:.2f} us (one by one: {:.2f} us, "
      "saves {:.2f} us)\nbackend calls (a collective: one per group): {}; the busiest tensor "
      "alone: {}\n",
      batch.collectives(), batch.collectives_unbatched(), human_bytes(batch.bytes_recv_max()),
      batch.est_us(), batch.est_us_unbatched(), batch.saving_us(), batch.backend_calls(),
      batch.backend_calls_alone_max());
  return out;
}

}  // namespace dtensor
