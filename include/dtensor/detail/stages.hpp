#pragma once

#include <cstddef>
#include <cstdint>

#include "../plan.hpp"
#include "../reduce_op.hpp"

// Which steps of a plan an executor runs as one: local steps in a row (chunk, fill, scale,
// identity) become one pass over the last block when the identities they place agree. The
// planner's memory bound counts the blocks between these stages.
namespace dtensor::detail {

// Whether R -> P(op) keeps the value on the group's first member and gives the others op's
// identity (product; sum by PlanOptions, and always for integers) rather than dividing it by the
// group's size (sum) or leaving it as it is (avg, max, min).
constexpr bool scale_keeps_one(const Plan& plan, ReduceOp op) {
  return op == ReduceOp::product ||
         (op == ReduceOp::sum &&
          (plan.options().partial_from_replicate == PartialFromReplicate::keep_one ||
           !is_floating(plan.src().dtype())));
}

// Steps that move nothing between ranks: each rank rewrites its own block.
constexpr bool is_local(StepKind k) {
  return k == StepKind::identity || k == StepKind::chunk || k == StepKind::fill ||
         k == StepKind::scale;
}

// Ops whose identities are the same value: 0 (sum, avg), lowest (max), highest (min), 1.
constexpr int identity_class(ReduceOp op) {
  return op == ReduceOp::avg ? static_cast<int>(ReduceOp::sum) : static_cast<int>(op);
}

// Whether the local steps first..last of `plan` run as one pass over the last block
// (run_local_steps): every identity they place (fill, a scale that keeps one) is the same value,
// and that value is 0 where they also divide or multiply (a scale that divides, a fill of avg).
constexpr bool local_steps_fuse(const Plan& plan, std::size_t first, std::size_t last) {
  int identity = -1;
  bool scales_values = false;
  for (std::size_t i = first; i <= last; ++i) {
    const Step& s = plan[i];
    if (!is_local(s.kind)) return false;
    if (s.kind != StepKind::fill && s.kind != StepKind::scale) continue;
    const ReduceOp op = s.after[s.mesh_dim].reduce_op();
    const bool places = s.kind == StepKind::fill || scale_keeps_one(plan, op);
    scales_values = scales_values || (s.kind == StepKind::fill && op == ReduceOp::avg) ||
                    (s.kind == StepKind::scale && !places && op == ReduceOp::sum);
    if (!places) continue;
    if (identity >= 0 && identity != identity_class(op)) return false;
    identity = identity_class(op);
  }
  return !scales_values || identity < 0 || identity == identity_class(ReduceOp::sum);
}

// The steps run_plan runs as one: a single step, or local steps fused (local_steps_fuse).
struct Stage {
  std::size_t first = 0, last = 0;
};

// The stages of `plan`, in order, into `stages` (max_plan_steps of room); how many.
constexpr std::size_t stages_of(const Plan& plan, Stage* stages) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    std::size_t last = i;
    while (is_local(plan[i].kind) && last + 1 < plan.size() && local_steps_fuse(plan, i, last + 1))
      ++last;
    stages[n++] = {i, last};
    i = last;
  }
  return n;
}

// The pieces the shards of `ps` cut base's tensor into where every one cuts its tensor dim into
// equal pieces (every rank's block then holds the tensor's elements over that many), else 0.
// Every mesh dim it asks base's mesh about is in range: it cannot throw.
// NOLINTNEXTLINE(bugprone-exception-escape): cannot throw, see above
constexpr std::int64_t even_pieces(const Layout& base, const Placements& ps) noexcept {
  const DeviceMesh& mesh = base.mesh();
  std::int64_t parts[max_tensor_dims] = {1, 1, 1, 1, 1, 1, 1, 1};
  std::int64_t all = 1;
  for (int k = 0; k < mesh.ndim(); ++k)
    if (ps[k].is_shard()) {
      parts[ps[k].dim()] *= mesh.size(k);
      all *= mesh.size(k);
    }
  for (int d = 0; d < base.tensor_ndim(); ++d)
    if (base.global_shape()[d] % parts[d] != 0) return 0;
  return all;
}

// The fewest elements of tensor dim d that any rank's range holds under `ps` (its shards cut d
// in mesh order, each into chunks of the range before), or 0 where that is not known: the
// smallest leaf of that nesting, over the distinct sizes of each level (chunks never grow with
// their index: a run of one size ends where a binary search finds the next smaller).
constexpr std::int64_t fewest_along(const Layout& base, const Placements& ps, int d) {
  constexpr int most = 16;  // distinct sizes kept per level
  std::int64_t level[most] = {base.global_shape()[static_cast<std::size_t>(d)]};
  int count = 1;
  const DeviceMesh& mesh = base.mesh();
  const ChunkPolicy policy = base.policy();
  for (int k = 0; k < mesh.ndim(); ++k) {
    if (!ps[k].is_shard(d)) continue;
    const int g = mesh.size(k);
    std::int64_t next[most] = {};
    int found = 0;
    for (int i = 0; i < count; ++i)
      for (int j = 0; j < g;) {
        const std::int64_t size = chunk_range(level[i], g, j, policy).size;
        bool seen = false;
        for (int u = 0; u < found && !seen; ++u) seen = next[u] == size;
        if (!seen) {
          if (found == most) return 0;
          next[found++] = size;
        }
        int a = j + 1, b = g;  // the first chunk after j that is smaller
        while (a < b) {
          const int m = a + (b - a) / 2;
          if (chunk_range(level[i], g, m, policy).size < size)
            b = m;
          else
            a = m + 1;
        }
        j = a;
      }
    count = found;
    for (int u = 0; u < count; ++u) level[u] = next[u];
  }
  std::int64_t fewest = level[0];
  for (int u = 1; u < count; ++u) fewest = level[u] < fewest ? level[u] : fewest;
  return fewest;
}

// Whether, on every rank, every block between the stages of `plan` holds no more elements than
// the larger of that rank's source and target blocks (Memory::bounded).
constexpr bool blocks_within_ends(const Plan& plan) {
  if (plan.size() < 2) return true;  // no block between steps
  Stage stages[max_plan_steps];
  const std::size_t n = stages_of(plan, stages);
  if (n < 2) return true;
  const Layout& base = plan.src();
  const DeviceMesh& mesh = base.mesh();
  // Where every layout is even, every rank's block holds the tensor's elements over the pieces
  // its shards cut: fewer pieces, a larger block, on every rank alike.
  const std::int64_t from_pieces = even_pieces(base, base.placements());
  const std::int64_t to_pieces = from_pieces > 0 ? even_pieces(base, plan.dst().placements()) : 0;
  bool all_even = to_pieces > 0;
  if (all_even) {
    const std::int64_t fewest = from_pieces < to_pieces ? from_pieces : to_pieces;
    for (std::size_t i = 0; i + 1 < n; ++i) {
      const std::int64_t pieces = even_pieces(base, plan[stages[i].last].after);
      if (pieces == 0) {
        all_even = false;
        break;
      }
      if (pieces < fewest) return false;
    }
    if (all_even) return true;
  }
  // Where the largest block between stages (the origin's: along every dim its range is the first
  // chunk of the first, the largest) holds no more than the fewest elements any rank holds at one
  // end (a product of the fewest along each dim), every rank is within, unvisited.
  std::int64_t fewest_from = 1, fewest_to = 1;
  for (int d = 0; d < base.tensor_ndim(); ++d) {
    fewest_from *= fewest_along(base, base.placements(), d);
    fewest_to *= fewest_along(base, plan.dst().placements(), d);
  }
  const std::int64_t floor = fewest_from > fewest_to ? fewest_from : fewest_to;
  const MeshCoord origin(static_cast<std::size_t>(mesh.ndim()), 0);
  bool within = true;
  for (std::size_t i = 0; i + 1 < n && within; ++i)
    within = base.local_box(plan[stages[i].last].after, origin).numel() <= floor;
  if (within) return true;
  for (int r = 0; r < mesh.size(); ++r) {
    const MeshCoord c = mesh.coordinate_at(r);
    const std::int64_t from = base.local_box(c).numel(), to = plan.dst().local_box(c).numel();
    const std::int64_t larger = from > to ? from : to;
    for (std::size_t i = 0; i + 1 < n; ++i)
      if (base.local_box(plan[stages[i].last].after, c).numel() > larger) return false;
  }
  return true;
}

}  // namespace dtensor::detail
