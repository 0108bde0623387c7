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
