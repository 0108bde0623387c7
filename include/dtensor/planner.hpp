#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <optional>

#include "config.hpp"
#include "cost_model.hpp"
#include "detail/block_relation.hpp"
#include "detail/block_shapes.hpp"
#include "detail/stages.hpp"
#include "detail/static_vector.hpp"
#include "detail/step_cost.hpp"
#include "detail/why.hpp"
#include "errors.hpp"
#include "layout.hpp"
#include "placement.hpp"
#include "plan.hpp"

// The redistribution planner: plan_redistribute(src, dst) is the C++ counterpart of PyTorch
// DTensor's redistribute_local_tensor, constexpr and allocation-free.
namespace dtensor {

namespace detail {

// A change of one mesh dim's placement.
struct Transition {
  int mesh_dim = 0;
  Placement from;
  Placement to;
  friend constexpr bool operator==(const Transition&, const Transition&) noexcept = default;
};

using Transitions = static_vector<Transition, max_plan_steps>;

// Whether mesh dim k is the innermost to shard tensor dim d (no later mesh dim does).
constexpr bool innermost_shard(const Placements& ps, int k, int d) noexcept {
  for (std::size_t j = static_cast<std::size_t>(k) + 1; j < ps.size(); ++j)
    if (ps[j].is_shard(d)) return false;
  return true;
}

// Whether a Partial with op `op` on mesh dim k can be reduced or made while the outer mesh dims
// are as in `ps`: mixed Partial ops reduce outermost first, so every Partial on an outer dim
// must commute with it (same op, or both linear). (P(product), P(sum)) -> (P(product), R)
// cannot all-reduce the sum first: the product over dim 0 of sums is not the sum of products.
constexpr bool passes_outer_partials(const Placements& ps, int k, ReduceOp op) noexcept {
  for (int j = 0; j < k; ++j)
    if (ps[j].is_partial() && !ops_commute(ps[j].reduce_op(), op)) return false;
  return true;
}

// Whether changing mesh dim k of `before` to `to` is one operation of the groups along k: a
// shard removed or added there must be the innermost sharding of its tensor dim, otherwise the
// inner mesh dims' pieces change meaning and data must cross groups; a Partial reduced or made
// there must commute with the Partials outside it. (Only mesh dim k changes, so every check
// reads the other dims from `before`.)
constexpr bool transition_valid_to(int k, const Placements& before, const Placement& to) {
  const Placement from = before[k];
  if (from == to) return true;
  if (from.is_shard() && !innermost_shard(before, k, from.dim())) return false;
  if (to.is_shard() && !innermost_shard(before, k, to.dim())) return false;
  if (from.is_partial() && !passes_outer_partials(before, k, from.reduce_op())) return false;
  if (to.is_partial() && !passes_outer_partials(before, k, to.reduce_op())) return false;
  return true;
}

// Whether `before` -> `after` changes mesh dim k alone, by one operation of its groups
// (transition_valid_to).
constexpr bool transition_valid(int k, const Placements& before, const Placements& after) {
  if (k < 0 || static_cast<std::size_t>(k) >= before.size() || before.size() != after.size())
    return false;
  for (std::size_t j = 0; j < before.size(); ++j)
    if (j != static_cast<std::size_t>(k) && !(before[j] == after[j])) return false;
  return transition_valid_to(k, before, after[static_cast<std::size_t>(k)]);
}

// The mesh dims before k that shard tensor dim d, as a bit set: the pieces a shard on k cuts.
constexpr unsigned outer_shards(const Placements& ps, int k, int d) noexcept {
  unsigned bits = 0;
  for (int j = 0; j < k; ++j)
    if (ps[j].is_shard(d)) bits |= 1u << j;
  return bits;
}

// Seed 004's order: shards removed from the innermost mesh dim outwards, then the rest in
// mesh order, then shards added from the outermost inwards. S(i) -> S(j) on one mesh dim goes
// through Replicate, and so does S(d) -> S(d) when the outer mesh dims sharding d differ
// (seed 004 compares only how many there are, which misorders e.g. (P, S(1), S(1)) ->
// (S(1), R, S(1)) on 2x2x2).
constexpr Transitions greedy_transitions(const Placements& src, const Placements& dst) {
  Transitions items;
  for (int k = 0; k < static_cast<int>(src.size()); ++k) {
    const Placement a = src[k], b = dst[k];
    if (a.is_shard() && b.is_shard() &&
        (a.dim() != b.dim() || outer_shards(src, k, a.dim()) != outer_shards(dst, k, b.dim()))) {
      items.push_back({k, a, Placement::replicate()});
      items.push_back({k, Placement::replicate(), b});
    } else if (!(a == b)) {
      items.push_back({k, a, b});
    }
  }
  auto key = [](const Transition& t) {
    if (t.from.is_shard() && !t.to.is_shard()) return -t.mesh_dim;
    if (!t.from.is_shard() && t.to.is_shard()) return t.mesh_dim;
    return 0;
  };
  // Stable insertion sort (at most 3 * 8 items).
  for (std::size_t i = 1; i < items.size(); ++i) {
    const Transition t = items[i];
    std::size_t j = i;
    for (; j > 0 && key(items[j - 1]) > key(t); --j) items[j] = items[j - 1];
    items[j] = t;
  }
  return items;
}

// Whether every transition of the sequence is a valid group operation, starting from `src`.
constexpr bool transitions_valid(const Placements& src, const Transitions& ts);

// Whether the transitions `x` and `y` make the same steps (plan_builder::add_transitions): equal
// once each change of a Partial's op, P(a) -> P(b), is written as the two it runs as, P(a) -> R
// (its all-reduce) and R -> P(b).
constexpr bool same_steps(const Transitions& x, const Transitions& y) noexcept {
  auto op_change = [](const Transition& t) {
    return t.from.is_partial() && t.to.is_partial() && !(t.from == t.to);
  };
  // Whether ts[at] and ts[at + 1] are the two transitions the op change t runs as.
  auto runs_as = [](const Transition& t, const Transitions& ts, std::size_t at) {
    return at + 1 < ts.size() && ts[at] == Transition{t.mesh_dim, t.from, Placement::replicate()} &&
           ts[at + 1] == Transition{t.mesh_dim, Placement::replicate(), t.to};
  };
  std::size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    if (x[i] == y[j]) {
      ++i;
      ++j;
    } else if (op_change(x[i]) && runs_as(x[i], y, j)) {
      ++i;
      j += 2;
    } else if (op_change(y[j]) && runs_as(y[j], x, i)) {
      i += 2;
      ++j;
    } else {
      return false;
    }
  }
  return i == x.size() && j == y.size();
}

// Moves each transition that makes a Partial (S or R to P) after the last reduction of a
// source Partial, where the sequence stays valid: reductions then run on real values, not on
// blocks padded with another op's identity (an integer max's identity, the lowest value,
// overflows a later sum).
constexpr Transitions reductions_first(const Placements& src, Transitions ts) {
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const Transition t = ts[i];
    if (!t.to.is_partial() || t.from.is_partial()) continue;
    std::size_t last = i;
    for (std::size_t j = i + 1; j < ts.size(); ++j)
      if (ts[j].from.is_partial()) last = j;
    if (last == i) continue;
    Transitions moved;
    for (std::size_t j = 0; j < ts.size(); ++j) {
      if (j != i) moved.push_back(ts[j]);
      if (j == last) moved.push_back(t);
    }
    if (transitions_valid(src, moved)) {
      ts = moved;
      --i;  // the next transition now sits at i
    }
  }
  return ts;
}
constexpr bool transitions_valid(const Placements& src, const Transitions& ts) {
  Placements state = src;
  for (const Transition& t : ts) {
    if (!(state[t.mesh_dim] == t.from) || !transition_valid_to(t.mesh_dim, state, t.to))
      return false;
    state[t.mesh_dim] = t.to;
  }
  return true;
}

// Whether the two layouts hold Partials (on either side) whose ops do not commute: then the
// order of reductions matters and the greedy sequence may have no valid order.
constexpr bool mixed_partials(const Placements& a, const Placements& b) noexcept {
  unsigned seen = 0;  // bit x: ReduceOp x occurs
  for (const Placements* ps : {&a, &b})
    for (const Placement& p : *ps)
      if (p.is_partial()) seen |= 1u << static_cast<unsigned>(p.reduce_op());
  if ((seen & (seen - 1)) == 0) return false;  // one op or none
  for (int x = 0; x < 5; ++x)
    for (int y = x + 1; y < 5; ++y)
      if ((seen >> x & 1u) != 0 && (seen >> y & 1u) != 0 &&
          !ops_commute(static_cast<ReduceOp>(x), static_cast<ReduceOp>(y)))
        return true;
  return false;
}

// A sequence that is valid whatever the Partials: every source Partial reduced to Replicate,
// outermost first (nothing outside it is Partial any more); then the greedy moves of shards;
// then the target's Partials made, innermost first (nothing outside them is Partial yet), in
// the first order of shard moves and makes that keeps every step valid.
constexpr Transitions reduce_all_first(const Placements& src, const Placements& dst) {
  Transitions reductions;
  Placements mid = src;
  for (int k = 0; k < static_cast<int>(src.size()); ++k)
    if (src[k].is_partial()) {
      reductions.push_back({k, src[k], Placement::replicate()});
      mid[k] = Placement::replicate();
    }
  const Transitions rest = greedy_transitions(mid, dst);
  Transitions moves, makes;
  for (const Transition& t : rest) (t.to.is_partial() ? makes : moves).push_back(t);
  // Candidate orders of the rest, first valid wins: seed 004's as it is; shards moved, then
  // Partials made innermost first; Partials made innermost first, then shards moved.
  for (int order = 0; order < 3; ++order) {
    Transitions ts = reductions;
    auto add_makes = [&] {
      for (int k = static_cast<int>(dst.size()); k-- > 0;)
        for (const Transition& t : makes)
          if (t.mesh_dim == k) ts.push_back(t);
    };
    if (order == 0)
      for (const Transition& t : rest) ts.push_back(t);
    if (order == 2) add_makes();
    if (order > 0)
      for (const Transition& t : moves) ts.push_back(t);
    if (order == 1) add_makes();
    if (transitions_valid(src, ts)) return ts;
  }
  // Else step by step: the first transition that is valid now, Partials made innermost first
  // preferred.
  Transitions pending;
  for (int k = static_cast<int>(dst.size()); k-- > 0;)
    for (const Transition& t : makes)
      if (t.mesh_dim == k) pending.push_back(t);
  for (const Transition& t : moves) pending.push_back(t);
  Transitions ts = reductions;
  Placements state = mid;
  while (!pending.empty()) {
    std::size_t pick = pending.size();
    for (std::size_t i = 0; i < pending.size() && pick == pending.size(); ++i)
      if (state[pending[i].mesh_dim] == pending[i].from &&
          transition_valid_to(pending[i].mesh_dim, state, pending[i].to))
        pick = i;
    if (pick == pending.size()) break;
    state[pending[pick].mesh_dim] = pending[pick].to;
    ts.push_back(pending[pick]);
    Transitions rest_pending;
    for (std::size_t i = 0; i < pending.size(); ++i)
      if (i != pick) rest_pending.push_back(pending[i]);
    pending = rest_pending;
  }
  if (pending.empty()) return ts;
  // Stuck: a shard the target keeps on an inner mesh dim blocks a Partial made from an outer
  // shard of the same tensor dim, e.g. (P(sum), S(0), S(0)) -> (P(sum), P(max), S(0)). Then
  // every shard is gathered, innermost first, the target's shards are cut outermost first and
  // its Partials made innermost first, all from Replicate: each step is valid, as nothing
  // outside a made Partial is Partial yet and nothing inside a cut shard is sharded yet.
  ts = reductions;
  for (int k = static_cast<int>(mid.size()); k-- > 0;)
    if (mid[k].is_shard()) ts.push_back({k, mid[k], Placement::replicate()});
  for (int k = 0; k < static_cast<int>(dst.size()); ++k)
    if (dst[k].is_shard()) ts.push_back({k, Placement::replicate(), dst[k]});
  for (int k = static_cast<int>(dst.size()); k-- > 0;)
    if (dst[k].is_partial()) ts.push_back({k, Placement::replicate(), dst[k]});
  return ts;
}

// The greedy sequence with S(i) -> R ... R -> S(j) pairs on one mesh dim turned into one
// all-to-all wherever the result stays valid.
constexpr Transitions with_all_to_all(const Placements& src, Transitions ts) {
  for (std::size_t a = 0; a < ts.size(); ++a) {
    const Transition ta = ts[a];
    if (!ta.from.is_shard() || !ta.to.is_replicate()) continue;
    for (std::size_t b = a + 1; b < ts.size(); ++b) {
      const Transition tb = ts[b];
      if (tb.mesh_dim != ta.mesh_dim) continue;
      if (!tb.from.is_replicate() || !tb.to.is_shard() || tb.to.dim() == ta.from.dim()) break;
      const Transition merged{ta.mesh_dim, ta.from, tb.to};
      for (int where = 0; where < 2; ++where) {
        Transitions trial;
        for (std::size_t i = 0; i < ts.size(); ++i) {
          if (i == a) {
            if (where == 0) trial.push_back(merged);
          } else if (i == b) {
            if (where == 1) trial.push_back(merged);
          } else {
            trial.push_back(ts[i]);
          }
        }
        if (transitions_valid(src, trial)) {
          ts = trial;
          break;
        }
      }
      break;
    }
  }
  return ts;
}

// The transitions with each reduce-scatter (P(op) -> S(j)) split into an all-reduce and a chunk
// (P(op) -> R -> S(j)): the all-reduce may run where the reduce-scatter cannot, before an outer
// gather of the same tensor dim, on the smaller block. (S(1), P) -> (R, S(1)) on 2x4 with
// uneven columns: all-reduce mesh dim 1, all-gather mesh dim 0, chunk mesh dim 1, as PyTorch.
constexpr Transitions split_reduce_scatters(const Transitions& ts) {
  Transitions out;
  for (const Transition& t : ts) {
    if (t.from.is_partial() && t.to.is_shard()) {
      out.push_back({t.mesh_dim, t.from, Placement::replicate()});
      out.push_back({t.mesh_dim, Placement::replicate(), t.to});
    } else {
      out.push_back(t);
    }
  }
  return out;
}

// The transitions with the i-th reduction to Replicate (P(op) -> R) split into a
// reduce-scatter to S(dims[i]) and an all-gather back (S(dims[i]) -> R) after everything else,
// the last reduced gathered first: every later reduction then runs on a scattered block, and
// the gathers move each element once. (P, P) -> (R, R) on 2x2 moves 1.5 times the tensor this
// way (reduce-scatter over both mesh dims, all-gather back) where two all-reduces move twice
// it.
constexpr Transitions scatter_reductions(const Transitions& ts, const int* dims) {
  Transitions out, gathers;
  int i = 0;
  for (const Transition& t : ts) {
    if (t.from.is_partial() && t.to.is_replicate()) {
      const Placement scattered = Placement::shard(dims[i++]);
      out.push_back({t.mesh_dim, t.from, scattered});
      gathers.push_back({t.mesh_dim, scattered, t.to});
    } else {
      out.push_back(t);
    }
  }
  for (std::size_t j = gathers.size(); j-- > 0;) out.push_back(gathers[j]);
  return out;
}

// Calls f(dims) for every choice of one of `nd` tensor dims for each of `count` items (dims[i]
// is item i's), while there are at most 16 choices (none otherwise) and f returns true.
template <class F>
constexpr void for_each_dim_choice(int count, int nd, F&& f) {
  int combos = nd > 0 ? 1 : 0;
  for (int i = 0; i < count && combos <= 16; ++i) combos *= nd;
  for (int combo = 0; combo < combos && combos <= 16; ++combo) {
    int dims[max_mesh_dims] = {};
    for (int i = 0, rest = combo; i < count; ++i, rest /= nd) dims[i] = rest % nd;
    if (!f(static_cast<const int*>(dims))) return;
  }
}

// A target Partial on mesh dim k, from a source Partial or made from Replicate: mesh dim k
// becomes S(d) first (reduce-scattered or chunked), then the transitions to the target with
// that S(d) made Partial among them (the order search places it; scatter_target_partial makes
// it last), so that another mesh dim's chunk may follow it: (S(0), R) -> (S(1), P) on 2x4
// chunks mesh dim 1, all-gathers mesh dim 0 a quarter block, fills mesh dim 1 and chunks mesh
// dim 0, as PyTorch's graph search does.
constexpr Transitions shard_then_make_partial(const Placements& a, const Placements& b, int k,
                                              int d) {
  Placements mid = a;
  mid[k] = Placement::shard(d);
  Transitions out;
  out.push_back({k, a[k], mid[k]});
  for (const Transition& t : reductions_first(mid, greedy_transitions(mid, b))) out.push_back(t);
  return out;
}

// Every target Partial on the mesh dims in `ks` (count of them) at once, as
// scatter_target_partial does one: mesh dim ks[i] becomes S(dims[i]) first, the rest moves as
// seed 004 orders it, and the Partials are made last, innermost first.
constexpr Transitions scatter_target_partials(const Placements& a, const Placements& b,
                                              const int* ks, const int* dims, int count) {
  Placements mid = a, end = b;
  Transitions out;
  for (int i = 0; i < count; ++i) {
    mid[ks[i]] = end[ks[i]] = Placement::shard(dims[i]);
    out.push_back({ks[i], a[ks[i]], mid[ks[i]]});
  }
  for (const Transition& t : reductions_first(mid, greedy_transitions(mid, end))) out.push_back(t);
  for (int i = count; i-- > 0;) out.push_back({ks[i], end[ks[i]], b[ks[i]]});
  return out;
}

// The transitions from placements `a` to `b`, whose target has a Partial on mesh dim k that the
// source has too (of the same op or another) or makes from Replicate or a Shard, with mesh dim k
// turned into S(d) first (a reduce-scatter, a local chunk or an all-to-all; nothing where it is
// S(d) already) and the Partial made from it last (a local fill):
// the group along k then splits the moves in between. (P, S(0)) -> (P, R) on 2x4: reduce-scatter
// mesh dim 0 to (S(1), S(0)), all-gather mesh dim 1, fill mesh dim 0, two thirds of the bytes of
// the all-gather alone. (R, P) -> (P, S(0)) on 2x2: chunk mesh dim 0 to S(1), reduce-scatter mesh
// dim 1, fill mesh dim 0, half the bytes of the reduce-scatter of the whole block.
//
// With e >= 0, for where the fill cannot run at the end because the target shards tensor dim d
// on mesh dims inside k too (the fill would change their pieces' meaning): those shards are made
// S(e) in between instead, and moved to S(d) after the fill (all-to-alls). Where the source holds
// Partials of ops that do not commute with the target's on k, the fill cannot run before their
// reductions either, and this is the only way the group along k splits the work: (P(sum),
// P(sum), P(max)) -> (P(sum), S(1), S(0)) on 2x2x2 reduce-scatters mesh dims 1, 0 and 2 (to
// S(1), S(0), S(1)), fills mesh dim 0 and all-to-alls mesh dim 2 to S(0), 8 us by the default
// model where reducing every Partial first took 12.
constexpr Transitions scatter_target_partial(const Placements& a, const Placements& b, int k, int d,
                                             int e = -1) {
  Placements mid = a, end = b;
  mid[k] = end[k] = Placement::shard(d);
  if (e >= 0)
    for (std::size_t j = static_cast<std::size_t>(k) + 1; j < b.size(); ++j)
      if (b[j].is_shard(d)) end[j] = Placement::shard(e);
  Transitions out;
  if (!(a[k] == mid[k])) out.push_back({k, a[k], mid[k]});
  for (const Transition& t : reductions_first(mid, greedy_transitions(mid, end))) out.push_back(t);
  out.push_back({k, end[k], b[k]});
  for (int j = static_cast<int>(b.size()); j-- > k + 1;)
    if (!(end[j] == b[j])) out.push_back({j, end[j], b[j]});
  return out;
}

// A detour on mesh dims `dims` (ascending) through placement m: each turned into m first (where
// it is not m already: a chunk, an all-to-all, a local fill or a reduce-scatter), the other mesh
// dims moved as seed 004 orders them, and each turned from m into the target's placement last,
// innermost first.
// With m a shard, the collectives in between move a block smaller by the dims' groups: (P, R) ->
// (R, R) on 2x8 chunks mesh dim 1, all-reduces an eighth of the block over mesh dim 0 and
// all-gathers it over mesh dim 1, a hierarchical all-reduce, a third of the time of the
// all-reduce of the whole block over mesh dim 0 by the default model. With m P(sum), a shard
// re-nests through a reduce-scatter. Where a slow outer mesh dim reduces or gathers, two inner
// ones shard its block first: (P, R, R) -> (S(0), P, S(0)) of 16 MiB on 4x2x2 chunks mesh dims 1
// and 2 along tensor dim 1, reduce-scatters a quarter of the block over mesh dim 0, all-to-alls
// mesh dim 2 to S(0) and fills mesh dim 1: 98 us by the default model, where every detour on
// one mesh dim took 164.
// With `first`, everything, the dims included, moves from there to the target as seed 004
// orders it, where the others' moves need m gone before they end: (S(1), S(1)) -> (S(0), P) of
// 16 MiB on 2x8 all-to-alls mesh dim 1 to S(0), gathers mesh dim 0, fills mesh dim 1 and chunks
// mesh dim 0: 48 us by the default model, against 55 for the exchange and 101 for the
// all-to-all of half the tensor over mesh dim 0.
constexpr Transitions detour(const Placements& a, const Placements& b,
                             std::initializer_list<int> dims, Placement m, bool first = false) {
  Placements mid = a, end = b;
  for (int j : dims) {
    mid[j] = m;
    if (!first) end[j] = m;
  }
  Transitions out;
  for (int j : dims)
    if (!(a[j] == m)) out.push_back({j, a[j], m});
  for (const Transition& t : reductions_first(mid, greedy_transitions(mid, end))) out.push_back(t);
  if (!first)
    for (auto j = std::rbegin(dims); j != std::rend(dims); ++j)
      if (!(b[*j] == m)) out.push_back({*j, m, b[*j]});
  return out;
}

// A detour whose moves in between undo m on j first (an outer gather needs j's shard of its
// tensor dim gone) without those two of j's transitions, where the order search finds a valid
// place for the rest: (S(0), R, S(1), R) -> (R, S(1), R, S(0)) of 8 MiB on 2x2x2x2 gathers mesh
// dim 2, chunks mesh dims 1 and 3, gathers mesh dim 0 and all-to-alls mesh dim 3, 46 us by the
// default model, where the detour as it is chunks and gathers back mesh dim 3 first (51 us).
// Empty where the detour does not undo m so.
constexpr Transitions detour_without_undo(const Transitions& detour, const Placements& a, int j) {
  int second = 1;
  while (second < static_cast<int>(detour.size()) && detour[second].mesh_dim != j) ++second;
  Transitions out;
  if (second == static_cast<int>(detour.size()) || !(detour[second].to == a[j])) return out;
  for (int i = 1; i < static_cast<int>(detour.size()); ++i)
    if (i != second) out.push_back(detour[i]);
  return out;
}

// The step kind of a transition of one mesh dim (P(a) -> P(b) is split before this).
constexpr StepKind step_kind(const Placement& from, const Placement& to) noexcept {
  if (from == to) return StepKind::identity;
  if (from.is_shard()) {
    if (to.is_replicate()) return StepKind::all_gather;
    if (to.is_shard()) return StepKind::all_to_all;
    return StepKind::fill;
  }
  if (from.is_replicate()) return to.is_shard() ? StepKind::chunk : StepKind::scale;
  if (to.is_shard()) return StepKind::reduce_scatter;
  return StepKind::all_reduce;
}

// The sum of the sizes of the distinct boxes among those of the ranks that agree with `base`
// on every dim where fixed[k], each intersected with `within` (boxes of one layout are equal
// or disjoint, so this is the size of their union inside `within`).
constexpr std::int64_t union_numel(const Layout& l, const Placements& ps, const MeshCoord& base,
                                   const bool* fixed, const Box& within) {
  // Ranks that differ only on non-shard dims hold the same box: one of each counts. Boxes are
  // products of ranges, so the sum is a product over tensor dims of sums over their shards.
  unsigned vary = 0;
  for (int k = 0; k < l.mesh().ndim(); ++k)
    if (!fixed[k] && ps[k].is_shard()) vary |= 1u << k;
  std::int64_t total = 1;
  for (int d = 0; d < l.tensor_ndim() && total != 0; ++d)
    total *= overlap_over(l, ps, base, vary, 0, d, {0, l.global_shape()[d]},
                          {within.offset[d], within.shape[d]});
  return total;
}

// Whether a mesh dim of `g` ranks reduces a source Partial `a` (the target `b` is not the same
// Partial there).
constexpr bool reduces_partial(const Placement& a, const Placement& b, int g) noexcept {
  return a.is_partial() && !(a == b) && g > 1;
}

// Elements the rank at `coord` must receive whatever the plan; lower_bound_bytes in bytes.
//  - Without Partial: the elements of its target block its source block lacks.
//  - A Partial target lets the ranks that differ only on those mesh dims (its target group)
//    split the work: the group must receive every element of the target block that none of
//    its members holds, and the busiest member at least its even share.
//  - A Partial source that must be reduced (the target is not the same Partial there) leaves
//    no element complete anywhere: every element of the target block needs at least one
//    incoming value (shared by the target group as above); and every element needs the
//    partial values of G-1 of the G ranks holding its parts (G: the product of the reduced
//    mesh dims' extents) shipped at least once, so some rank of the N receives at least
//    (G-1) * numel / N (for one mesh dim, the reduce-scatter bound (g-1)/g of the tensor).
constexpr std::int64_t lower_bound_elements(const Layout& src, const Layout& dst,
                                            const MeshCoord& coord) {
  const DeviceMesh& mesh = src.mesh();
  const int n = mesh.ndim();
  bool target_fixed[max_mesh_dims] = {};
  Placements have = src.placements(), want = dst.placements();
  std::int64_t group = 1, reducers = 1;
  bool reduces = false;
  for (int k = 0; k < n; ++k) {
    const Placement a = have[k], b = want[k];
    target_fixed[k] = !b.is_partial();
    if (b.is_partial()) group *= mesh.size(k);
    if (reduces_partial(a, b, mesh.size(k))) reduces = true, reducers *= mesh.size(k);
    if (a.is_partial()) have[k] = Placement::replicate();
    if (b.is_partial()) want[k] = Placement::replicate();
  }
  const Box target = src.local_box(want, coord);
  const std::int64_t missing =
      reduces ? target.numel()
              : target.numel() - union_numel(src, have, coord, target_fixed, target);
  std::int64_t bound = (missing + group - 1) / group;
  if (reduces) {
    const std::int64_t ranks = mesh.size();
    const std::int64_t share =
        bytes_add(bytes_mul(reducers - 1, src.global_numel()), ranks - 1) / ranks;
    bound = share > bound ? share : bound;
  }
  return bound;
}

// The ranges of tensor dim d that the rank at `coord` holds under `from` and under `to`, cut as
// Layout::local_box cuts (nested in mesh order), and how many elements they share.
struct HeldRanges {
  Range from, to;
  [[nodiscard]] constexpr std::int64_t shared() const noexcept { return overlap_size(from, to); }
};
constexpr HeldRanges held_ranges(const Layout& base, const Placements& from, const Placements& to,
                                 const MeshCoord& coord, int d) {
  const DeviceMesh& mesh = base.mesh();
  HeldRanges r{{0, base.global_shape()[d]}, {0, base.global_shape()[d]}};
  for (int k = 0; k < mesh.ndim(); ++k) {
    if (from[k].is_shard(d)) {
      const Range c = chunk_range(r.from.size, mesh.size(k), coord[k], base.policy());
      r.from = {r.from.start + c.start, c.size};
    }
    if (to[k].is_shard(d)) {
      const Range c = chunk_range(r.to.size, mesh.size(k), coord[k], base.policy());
      r.to = {r.to.start + c.start, c.size};
    }
  }
  return r;
}

// The elements some rank holds in both its source and target blocks: each side's blocks are
// equal or disjoint between ranks, so this sums over the ranks that differ on a mesh dim that
// shards either side. The whole tensor (nothing learnt) where those are more than 64.
constexpr std::int64_t held_in_both(const Layout& src, const Layout& dst) {
  constexpr int max_ranks = 64;
  // Where one side shards nothing its blocks are the whole tensor, and the other side's blocks
  // over the ranks that differ where it shards tile the tensor: every element is held in both.
  auto shards = [](const Placements& ps) {
    return std::any_of(ps.begin(), ps.end(), [](const Placement& p) { return p.is_shard(); });
  };
  if (!shards(src.placements()) || !shards(dst.placements())) return src.global_numel();
  const DeviceMesh& mesh = src.mesh();
  bool fixed[max_mesh_dims] = {};
  std::int64_t ranks = 1;
  for (int k = 0; k < mesh.ndim(); ++k) {
    fixed[k] = !src.placement(k).is_shard() && !dst.placement(k).is_shard();
    if (!fixed[k]) ranks *= mesh.size(k);
  }
  if (ranks > max_ranks) return src.global_numel();
  std::int64_t held = 0;
  for_each_coord(mesh, MeshCoord(static_cast<std::size_t>(mesh.ndim()), 0), fixed,
                 [&](const MeshCoord& c) {
                   std::int64_t both = 1;
                   for (int d = 0; d < src.tensor_ndim() && both != 0; ++d)
                     both *= held_ranges(src, src.placements(), dst.placements(), c, d).shared();
                   held += both;
                 });
  return held;
}

// Elements some rank must receive to reduce a Partial source into a target whose Partial dims
// all keep the source's, or (made below) all are made from other placements, whatever the plan:
// 0 when no Partial is reduced, a Partial changes op, or a target keeps one and makes one. An
// element has G distinct parts (G: the product of the extents of the
// source's Partial dims, kept and reduced), and in each of the K classes of ranks that agree on
// the kept dims, T ranks whose target block holds it (T: the product of the extents of the
// target's Replicate dims). Any plan leaves some y >= 1 classes holding values that depend on the
// parts, the others holding constants. Merging the G parts into y values takes G - y messages (a
// rank knowing m+1 parts has m messages in its past); each of the T ranks of those classes then
// receives at least one, one of them possibly among the merges. So an element costs at least
// G - y + y (T - 1) receives: G + T - 2 with one class (T >= 2), G - K with every class (T = 1).
// With one class, one more where no rank holds the element in both its source and target
// blocks (held_in_both): take a rank that knows the value with no other such rank in its causal
// past; the ranks whose parts it merged and it are joined by at least G - 1 receives, G if it
// holds no part, and each other target holder's receive that completes it comes later. So the
// element costs G + T - 2 only if that rank is a target holder holding a part, else G + T - 1.
// The busiest of the N ranks receives at least the sum over N: for one mesh dim exactly the ring
// all-reduce's 2(g-1)/g and reduce-scatter's (g-1)/g of the tensor. The classes are not
// independent: (P, P) -> (P, R) on 2x4 reduce-scatters mesh dim 0, all-reduces mesh dim 1 and
// fills mesh dim 0, receiving 1.25 times the tensor per rank (this bound), where an all-reduce
// within each class receives 1.5 times it.
// Made Partials (the target's Partial dims, of more than one rank, where the source holds none,
// every source Partial reduced): the ranks that differ only there form a target group, whose
// values combine to the element's; the T groups whose target block holds it (T as above) each
// need every part in the union of their members' causal pasts, and a group's members all hold
// the same part or none (they agree on the source's Partial dims). The first group to cover
// all G parts has at least G - 1 receives in those pasts (the messages link G distinct holders
// to its members, at most one of them a holder); one receive completes one group at most, so
// each of the T - 1 others receives once more afterwards: G + T - 2 per element. (S(0), P) ->
// (P(sum), R) on 2x4: 6 per element, 3/4 of the tensor per rank, the all-reduce on mesh dim 1.
constexpr std::int64_t reduction_elements(const Layout& src, const Layout& dst) {
  const DeviceMesh& mesh = src.mesh();
  std::int64_t parts = 1, reduced = 1, replicas = 1, classes = 1;
  bool made = false;
  for (int k = 0; k < mesh.ndim(); ++k) {
    const Placement a = src.placement(k), b = dst.placement(k);
    if (a.is_partial()) parts *= mesh.size(k);
    if (a.is_partial() && a == b) {
      classes *= mesh.size(k);
      continue;
    }
    if (b.is_partial()) {
      if (a.is_partial()) return 0;  // another op on the same ranks: not counted here
      made = made || mesh.size(k) > 1;
      continue;
    }
    if (a.is_partial()) reduced *= mesh.size(k);
    if (b.is_replicate()) replicas *= mesh.size(k);
  }
  if (reduced == 1 || (made && classes > 1)) return 0;
  // With made Partials (one class) this is G + T - 2 as well, G - 1 when T = 1; the one more
  // receive of an element no rank holds on both sides counts target ranks, not groups.
  const std::int64_t per_element = replicas >= 2 ? parts + replicas - 2 : parts - classes;
  std::int64_t total = bytes_mul(per_element, src.global_numel());
  if (classes == 1 && !made) total = bytes_add(total, src.global_numel() - held_in_both(src, dst));
  return bytes_add(total, mesh.size() - 1) / mesh.size();
}

// Elements some rank must receive when the target keeps every Partial of the source (same op
// on the same mesh dims K, G classes of ranks by their coordinates there) and makes none,
// whatever the plan; 0 when that is not the case or the count is too large to make here. The
// blocks depend only on the other coordinates, so every class has, for an element e, the same
// T ranks whose target block holds e, h of which hold e (their class's part of it) in their
// source block, and m = T - h lacking it. Any plan leaves each class c holding some X_c with
// op(X_c) = op(parts). A class whose X_c depends on its own part alone pays m receives (one per
// lacking rank); a class holding a constant pays none, but its part must then be merged into
// another class, every one of whose T ranks receives (at least one message each, and merging z
// parts takes z messages, one of which can be its holder's own receive when h > 0). So e costs
// 0 when m = 0, else at least min(G m, G - 1 + T - [h > 0]) receives in all (all classes
// constant but one is the cheapest way to mix), and the busiest of the N ranks receives at least
// the sum over the elements over N. (S(0), P) -> (R, P) on 2x2: 2 per element, the all-gather's
// half of the tensor per rank, where lower_bound_elements' per-group split gives a quarter.
constexpr std::int64_t kept_partial_elements(const Layout& src, const Layout& dst) {
  const DeviceMesh& mesh = src.mesh();
  const int n = mesh.ndim(), nd = src.tensor_ndim();
  bool kept[max_mesh_dims] = {};
  std::int64_t classes = 1;
  Placements have = src.placements(), want = dst.placements();
  for (int k = 0; k < n; ++k) {
    const Placement a = have[k], b = want[k];
    if (a.is_partial() != b.is_partial() || (a.is_partial() && !(a == b))) return 0;
    if (!a.is_partial()) continue;
    kept[k] = true;
    classes *= mesh.size(k);
    have[k] = want[k] = Placement::replicate();
  }
  if (classes == 1 || nd == 0 || src.global_numel() == 0) return 0;
  // The blocks of one class's ranks, as [lo, hi) per tensor dim: side 0 the source's, side 1 the
  // target's. Only the first `members` entries are used, each written before it is read: not
  // cleared (nor are `cuts` below).
  constexpr int max_members = 32;
  // NOLINTNEXTLINE(cppcoreguidelines-init-variables): see above
  std::int64_t lo[2][max_members][max_tensor_dims], hi[2][max_members][max_tensor_dims];
  int members = 0;
  bool too_many = false;
  // Where the target replicates along no other mesh dim, its blocks in a class are disjoint: T = 1
  // for every element, m is 0 or 1, and min(G m, G - 1 + T - [h > 0]) = G m. The count is then G
  // times the elements the class's ranks lack (`lacked`), each rank's from its two blocks alone.
  bool replicated = false;
  for (int k = 0; k < n; ++k)
    replicated = replicated || (!kept[k] && dst.placements()[k].is_replicate());
  std::int64_t lacked = 0;
  for_each_coord_while(mesh, MeshCoord(static_cast<std::size_t>(n), 0), kept,
                       [&](const MeshCoord& c) {
                         if (members == max_members) {
                           too_many = true;
                           return false;
                         }
                         std::int64_t wanted = 1, shared = 1;
                         for (int d = 0; d < nd; ++d) {
                           const HeldRanges r = held_ranges(src, have, want, c, d);
                           lo[0][members][d] = r.from.start;
                           hi[0][members][d] = r.from.start + r.from.size;
                           lo[1][members][d] = r.to.start;
                           hi[1][members][d] = r.to.start + r.to.size;
                           wanted *= r.to.size;
                           shared *= r.shared();
                         }
                         lacked = bytes_add(lacked, wanted - shared);
                         ++members;
                         return true;
                       });
  if (too_many) return 0;
  // The work limit: cells as if no two blocks shared a boundary, whatever they share.
  constexpr int max_cuts = 4 * max_members + 2;
  std::int64_t cells = 1;
  for (int d = 0; d < nd; ++d) cells *= 4 * members + 1;
  if (cells * members > (std::int64_t{1} << 14)) return 0;
  if (!replicated) return bytes_add(bytes_mul(classes, lacked), mesh.size() - 1) / mesh.size();
  // Per tensor dim, every distinct block boundary, sorted: the cells between them are inside or
  // outside each block.
  std::int64_t cuts[max_tensor_dims][max_cuts];  // NOLINT(cppcoreguidelines-init-variables)
  int num_cuts[max_tensor_dims] = {};
  for (int d = 0; d < nd; ++d) {
    std::int64_t* at = cuts[d];
    int& count = num_cuts[d];
    auto add = [&](std::int64_t x) {
      int i = count;
      while (i > 0 && at[i - 1] > x) --i;
      if (i > 0 && at[i - 1] == x) return;
      for (int j = count; j > i; --j) at[j] = at[j - 1];
      at[i] = x;
      ++count;
    };
    add(0);
    add(src.global_shape()[d]);
    for (int i = 0; i < members; ++i)
      for (int side = 0; side < 2; ++side) {
        add(lo[side][i][d]);
        add(hi[side][i][d]);
      }
  }
  std::int64_t total = 0;
  int cell[max_tensor_dims] = {};
  while (true) {
    std::int64_t numel = 1;
    for (int d = 0; d < nd; ++d) numel *= cuts[d][cell[d] + 1] - cuts[d][cell[d]];
    // Every cell holds elements: the cuts are distinct.
    std::int64_t holders = 0, lacking = 0;
    // A cell lies inside a block or outside it: its first element says which.
    auto holds = [&](int side, int i) {
      for (int d = 0; d < nd; ++d) {
        const std::int64_t x = cuts[d][cell[d]];
        if (x < lo[side][i][d] || x >= hi[side][i][d]) return false;
      }
      return true;
    };
    for (int i = 0; i < members; ++i)
      if (holds(1, i)) (holds(0, i) ? holders : lacking) += 1;
    if (lacking > 0) {
      const std::int64_t own = classes * lacking;
      const std::int64_t mixed = classes - 1 + holders + lacking - (holders > 0 ? 1 : 0);
      total = bytes_add(total, bytes_mul(numel, own < mixed ? own : mixed));
    }
    int d = nd - 1;
    for (; d >= 0; --d) {
      if (++cell[d] + 1 < num_cuts[d]) break;
      cell[d] = 0;
    }
    if (d < 0) break;
  }
  return bytes_add(total, mesh.size() - 1) / mesh.size();
}

// What the rank at `coord` lacks of its target block (placements `to`) after holding its block
// of `from`: the elements, whether it holds some of them, and the target block's range along
// every tensor dim (for sources_of).
struct Missing {
  std::int64_t elements = 0;
  bool holds_some = false;
  Range wanted[max_tensor_dims] = {};
};
constexpr Missing missing_at(const Layout& base, const Placements& from, const Placements& to,
                             const MeshCoord& coord) {
  Missing out;
  std::int64_t want = 1, kept = 1;
  for (int d = 0; d < base.tensor_ndim(); ++d) {
    const HeldRanges r = held_ranges(base, from, to, coord, d);
    want *= r.to.size;
    kept *= r.shared();
    out.wanted[d] = r.to;
  }
  out.elements = want - kept;
  out.holds_some = kept > 0;
  return out;
}

// The number of blocks of `from` other than the rank's own that hold some of the target block
// of `m` (missing_at; the blocks of a layout tile the tensor, or each class of a Partial's).
constexpr std::int64_t sources_of(const Layout& base, const Placements& from, const Missing& m) {
  std::int64_t blocks = 1;
  for (int d = 0; d < base.tensor_ndim(); ++d)
    blocks *= pieces_overlapping(base, from, 0, d, {0, base.global_shape()[d]}, m.wanted[d]);
  return blocks - (m.holds_some ? 1 : 0);
}

// lower_bound_elements for layouts without Partial, in O(tensor dims x mesh dims): the elements
// of the target block of the rank at `coord` its source block lacks, from the ranges each
// side's shards cut along every tensor dim (nested outermost first, as Layout::local_box).
// The placements `from` and `to` are of `base`'s tensor and mesh.
// With `sources`, also the number of blocks of `from` other than the rank's own that hold some
// of its target block (sources_of).
constexpr std::int64_t missing_elements(const Layout& base, const Placements& from,
                                        const Placements& to, const MeshCoord& coord,
                                        std::int64_t* sources = nullptr) {
  const Missing m = missing_at(base, from, to, coord);
  if (sources != nullptr) *sources = sources_of(base, from, m);
  return m.elements;
}

// Whether every shard of `ps` over base's mesh cuts its tensor dim into equal pieces. Every
// mesh dim it asks base's mesh about is in range: it cannot throw.
// NOLINTNEXTLINE(bugprone-exception-escape): cannot throw, see above
constexpr bool is_even(const Layout& base, const Placements& ps) noexcept {
  return even_pieces(base, ps) > 0;
}

// Whether `a` and `b` (same tensor and mesh) are even and, along every tensor dim, the mesh
// dims that cut it under one are the first of those that cut it under the other (in mesh dim
// order): then every rank's piece of that dim under one holds its piece under the other.
constexpr bool nested_alike(const Layout& a, const Layout& b) {
  const int n = a.mesh().ndim();
  for (int d = 0; d < a.tensor_ndim(); ++d) {
    int i = 0, j = 0;  // walk both cut sequences of d in step; one may end first
    while (true) {
      while (i < n && !a.placement(i).is_shard(d)) ++i;
      while (j < n && !b.placement(j).is_shard(d)) ++j;
      if (i == n || j == n) break;
      if (i != j) return false;
      ++i;
      ++j;
    }
  }
  return is_even(a, a.placements()) && is_even(a, b.placements());
}

// The origin's block under `ps` (base's tensor and mesh), as base.local_box(ps, origin) gives
// it, where every shard of `ps` cuts its tensor dim into equal pieces (is_even); false, and
// `box` unspecified, where some does not.
constexpr bool even_origin_box(const Layout& base, const Placements& ps, Box& box) {
  const DeviceMesh& mesh = base.mesh();
  box.shape = base.global_shape();
  box.offset = Shape(box.shape.size(), 0);
  for (int k = 0; k < mesh.ndim(); ++k)
    if (ps[k].is_shard()) {
      std::int64_t& n = box.shape[static_cast<std::size_t>(ps[k].dim())];
      const int g = mesh.size(k);
      if (n % g != 0) return false;
      n /= g;
    }
  return true;
}

// The placement's code in 4 bits: R 0, S(d) 1 + d, P(op) 9 + op.
constexpr std::uint64_t placement_code(const Placement& p) {
  if (p.is_shard()) return 1 + static_cast<std::uint64_t>(p.dim());
  if (p.is_partial()) return 9 + static_cast<std::uint64_t>(p.reduce_op());
  return 0;
}

// The step costs order_step_cost worked out over more than 8 ranks (from the kinds of block
// pair, or rank by rank), by the step (placements before, mesh dim and placement after: all
// its other placements are before's) within one search: the order searches of its candidates
// meet the same steps again (on 600 random pairs of 16 to 1,024 ranks, 7,554 such steps of
// 2,601 kinds).
using OrderCostMemo = KeyedMemo<double, 128>;

// What step `kind` from `before` to `after` on mesh dim k costs its busiest rank, for ranking
// orders: bytes received under Objective::bytes (time breaking ties), else time. Unpadded;
// with every piece even, or for an all-reduce, rank 0 speaks for all. With a `memo`, a step
// over more than 8 ranks (after as before but on mesh dim k) is costed once.
constexpr double order_step_cost(const Layout& base, const Placements& before,
                                 const Placements& after, int k, const PlanOptions& o,
                                 OrderCostMemo* memo = nullptr) {
  const Placement from = before[k];
  const Placement to = after[k];
  StepKind kind = step_kind(from, to);
  Placements to_state = after;
  if (from.is_partial() && to.is_partial()) {  // P(a) -> P(b): the all-reduce costs
    kind = StepKind::all_reduce;
    to_state[k] = Placement::replicate();
  }
  const DeviceMesh& mesh = base.mesh();
  if (!moves_data(kind) || mesh.size(k) == 1) return 0;
  double most = 0;
  const MeshCoord origin(static_cast<std::size_t>(mesh.ndim()), 0);
  auto consider = [&](const MeshCoord& c, const Box& have, const Box& want) {
    const RankStepCost rc =
        rank_step_cost(base, before, to_state, kind, k, false, c, have, want, o.cost_model);
    const double v =
        o.objective == Objective::bytes ? static_cast<double>(rc.bytes.recv) + rc.us * 1e-9 : rc.us;
    most = v > most ? v : most;
  };
  // Between even layouts every rank's blocks are the origin's in extent.
  Box have, want;
  if (even_origin_box(base, before, have) && even_origin_box(base, to_state, want)) {
    consider(origin, have, want);
    return most;
  }
  // An all-reduce costs the origin the most (plan_builder::costs_most_at_origin).
  if (kind == StepKind::all_reduce) {
    consider(origin, base.local_box(before, origin), base.local_box(to_state, origin));
    return most;
  }
  bool fixed[max_mesh_dims] = {};
  for (int j = 0; j < mesh.ndim(); ++j) fixed[j] = !before[j].is_shard() && !to_state[j].is_shard();
  const bool many = visited_coords(mesh, fixed) > 8;
  // The memo's key: before's placements, k and to_state's placement there (to_state as before
  // elsewhere, else no key).
  std::uint64_t key = 0;
  bool keyed = many && memo != nullptr;
  for (int j = 0; j < mesh.ndim() && keyed; ++j) {
    keyed = j == k || before[j] == to_state[j];
    key |= placement_code(before[j]) << (4 * j);
  }
  if (keyed) {
    key |= static_cast<std::uint64_t>(k) << 32 | placement_code(to_state[k]) << 35;
    if (const double* known = memo->find(key)) return *known;
  }
  // On more than 8 ranks, one block pair of each kind (the step is no all-reduce here: what it
  // costs a rank depends on its blocks' extents and overlaps alone).
  if (!many || !for_each_block_shape(base, before, to_state, [&](const Box& b1, const Box& b2) {
        consider(origin, b1, b2);
      }))
    for_each_coord(mesh, origin, fixed, [&](const MeshCoord& c) {
      consider(c, base.local_box(before, c), base.local_box(to_state, c));
    });
  if (keyed) memo->remember(key, most);
  return most;
}

// The order of the transitions `ts` (from `src`'s placements) with the least summed step cost
// (order_step_cost), by dynamic programming over the sets of transitions done: transitions of
// one mesh dim keep their order, every step stays a valid group operation, and Partials are
// made only after the source's Partials are reduced (as reductions_first). Collectives cost
// less on smaller blocks, so this runs local chunks and reductions before gathers where that
// is cheaper: (S(0), R) -> (R, S(1)) chunks mesh dim 1 first and all-gathers a quarter block.
// Returns `ts` itself when it has fewer than 2 or more than max_ordered_transitions items.
// Under the time objective with `beat` (the time a plan must not exceed to be kept,
// plan_builder::time_to_beat), where the sums are plans' times (every tensor dim the
// placements shard divides by the mesh's ranks, so every layout on the way is even and the
// plan costs as cost_even does, and no pair of transitions makes an all-to-all for
// with_all_to_all), orders already slower than `beat` go no further, and where every order
// is, returns no transitions (`Cut`: the search's detours, where sums pass `beat` often enough
// to repay the test; elsewhere it costs more than it saves). `memo`, where given, keeps the
// step costs over many ranks across the order searches of one plan (order_step_cost). `own`,
// where given, is the summed step cost of `ts` in its own order (the time of the caller's plan
// of it where every layout is even, plan_builder::cost_even), not costed again for two items.
inline constexpr int max_ordered_transitions = 8;
template <bool Cut = false>
constexpr Transitions cheapest_order(const Layout& base, const Transitions& ts,
                                     const PlanOptions& o,
                                     double beat = std::numeric_limits<double>::infinity(),
                                     OrderCostMemo* memo = nullptr, const double* own = nullptr) {
  const int t = static_cast<int>(ts.size());
  if (t < 2 || t > max_ordered_transitions) return ts;
  constexpr int states = 1 << max_ordered_transitions;
  constexpr double unreached = 1e300;
  // Only the first 2^t entries are used, each written before it is read: not cleared.
  double best[states];  // NOLINT(cppcoreguidelines-init-variables): see above
  int last[states];     // NOLINT(cppcoreguidelines-init-variables): see above
  unsigned before_mask[max_ordered_transitions] = {};  // what must be done before item i
  unsigned reductions = 0;
  for (int i = 0; i < t; ++i)
    if (ts[i].from.is_partial()) reductions |= 1u << i;
  for (int i = 0; i < t; ++i) {
    for (int j = 0; j < i; ++j)
      if (ts[j].mesh_dim == ts[i].mesh_dim) before_mask[i] |= 1u << j;
    if (ts[i].to.is_partial() && !ts[i].from.is_partial()) before_mask[i] |= reductions;
  }
  // When every item needs exactly the items before it, `ts` is the only order.
  bool forced = true;
  for (int i = 0; i < t && forced; ++i) forced = before_mask[i] == (1u << i) - 1;
  if (forced) return ts;
  // Two items: their two orders costed directly, as the program below finds them (the second
  // only where it costs less).
  if constexpr (!Cut)
    if (t == 2) {
      const auto order_cost = [&](int x, int y) {
        const Transition& tx = ts[x];
        const Transition& ty = ts[y];
        if (before_mask[x] != 0 || (before_mask[y] & ~(1u << x)) != 0) return unreached;
        const Placements& state = base.placements();
        if (!(state[tx.mesh_dim] == tx.from) || !transition_valid_to(tx.mesh_dim, state, tx.to))
          return unreached;
        Placements next = state;
        next[tx.mesh_dim] = tx.to;
        if (!(next[ty.mesh_dim] == ty.from) || !transition_valid_to(ty.mesh_dim, next, ty.to))
          return unreached;
        if (x == 0 && own != nullptr) return *own;
        const double first = order_step_cost(base, state, next, tx.mesh_dim, o, memo);
        Placements after = next;
        after[ty.mesh_dim] = ty.to;
        return first + order_step_cost(base, next, after, ty.mesh_dim, o, memo);
      };
      const double kept = order_cost(0, 1), swapped = order_cost(1, 0);
      if (swapped < kept && swapped < unreached) return Transitions{ts[1], ts[0]};
      return ts;
    }
  // Where an item needs itself (a Partial made on a mesh dim that reduces one later, as in
  // detours through P(sum)), there is none.
  if constexpr (Cut)
    for (int i = 0; i < t; ++i)
      if ((reductions >> i & 1u) != 0)
        for (int j = 0; j < i; ++j)
          if ((before_mask[i] >> j & 1u) != 0 && (before_mask[j] >> i & 1u) != 0) return ts;
  // Whether the sums below are plans' times (one mesh dim's gather and later chunk to another
  // tensor dim may merge into an all-to-all, cheaper): asked once a sum passes `beat`.
  const auto sums_exact = [&] {
    if (o.objective != Objective::time) return false;
    const std::int64_t ranks = base.mesh().size();
    const auto divides = [&](const Placement& p) {
      return !p.is_shard() || base.global_shape()[static_cast<std::size_t>(p.dim())] % ranks == 0;
    };
    if (!std::ranges::all_of(base.placements(), divides) ||
        !std::ranges::all_of(ts, [&](const Transition& tr) { return divides(tr.to); }))
      return false;
    for (int i = 0; i < t; ++i) {
      if (!ts[i].from.is_shard() || !ts[i].to.is_replicate()) continue;
      for (int j = i + 1; j < t; ++j)
        if (ts[j].mesh_dim == ts[i].mesh_dim) {
          if (ts[j].from.is_replicate() && ts[j].to.is_shard() &&
              ts[j].to.dim() != ts[i].from.dim())
            return false;
          break;
        }
    }
    return true;
  };
  int exact = -1;  // sums_exact(), once asked
  const unsigned full = (1u << t) - 1;
  // Orders past `limit` go no further where the sums are exact (`beat`, then, where that leaves
  // none but `ts` is none of them, as without it).
  for (double limit = beat;; limit = std::numeric_limits<double>::infinity()) {
    bool cut = false;  // whether some order went no further
    best[0] = 0;
    for (unsigned m = 1; m <= full; ++m) best[m] = unreached;
    for (unsigned m = 0; m < full; ++m) {
      // Past `limit`, no order through m makes a plan that is kept.
      if (best[m] >= unreached) continue;
      if constexpr (Cut)
        if (best[m] > limit && (exact < 0 ? (exact = sums_exact() ? 1 : 0) : exact) == 1) {
          cut = true;
          continue;
        }
      Placements state = base.placements();
      for (int i = 0; i < t; ++i)  // one dim's transitions are done in index order
        if ((m >> i & 1u) != 0) state[ts[i].mesh_dim] = ts[i].to;
      for (int i = 0; i < t; ++i) {
        if ((m >> i & 1u) != 0 || (before_mask[i] & ~m) != 0) continue;
        const Transition& tr = ts[i];
        if (!(state[tr.mesh_dim] == tr.from) || !transition_valid_to(tr.mesh_dim, state, tr.to))
          continue;
        Placements next = state;
        next[tr.mesh_dim] = tr.to;
        const unsigned n = m | 1u << i;
        const double c = best[m] + order_step_cost(base, state, next, tr.mesh_dim, o, memo);
        if (c < best[n]) {
          best[n] = c;
          last[n] = i;
        }
      }
    }
    if (!cut || best[full] < unreached) break;
    // Every order went no further or is not valid, `ts` as it is too where it is one of them.
    bool searched = true;
    for (int i = 0; i < t && searched; ++i) searched = (before_mask[i] >> i) == 0;
    if (searched) return {};
  }
  if (best[full] >= unreached) return ts;
  if constexpr (Cut)
    if (best[full] > beat && (exact < 0 ? sums_exact() : exact == 1)) return {};
  int order[max_ordered_transitions] = {};
  for (unsigned m = full, i = static_cast<unsigned>(t); m != 0; m &= ~(1u << last[m]))
    order[--i] = last[m];
  Transitions out;
  for (int i = 0; i < t; ++i) out.push_back(ts[order[i]]);
  return out;
}

// Whether every tensor dim divides by the mesh's ranks: every layout of the tensor is even.
constexpr bool divides_everywhere(const Layout& base) noexcept {
  const std::int64_t ranks = base.mesh().size();
  return std::ranges::all_of(base.global_shape(), [&](std::int64_t n) { return n % ranks == 0; });
}

// Whether no order of the transitions `ts` from `base` makes a plan faster than one of its orders
// that moves no more than the lower bound: the tensor is not empty and each of its dims divides
// by the mesh's ranks (every layout on the way is even, so each collective pays g-1 messages,
// an all-reduce 2(g-1), whatever its block), no two transitions share a mesh dim (no order
// merges two into an all-to-all), and the mesh dims where they move data share one bandwidth.
// Every order's time is then the same latency plus its bytes, each at least the bound, over that
// bandwidth; a tie in time has as many steps and no fewer bytes (detail::better).
constexpr bool order_cannot_pay(const Layout& base, const Transitions& ts, const CostModel& model) {
  if (base.global_numel() == 0 || !divides_everywhere(base)) return false;
  const DeviceMesh& mesh = base.mesh();
  unsigned dims = 0;
  double gbs = -1;
  for (const Transition& t : ts) {
    if ((dims >> t.mesh_dim & 1u) != 0) return false;
    dims |= 1u << t.mesh_dim;
    const bool moves =
        (t.from.is_partial() && t.to.is_partial()) || moves_data(step_kind(t.from, t.to));
    if (!moves || mesh.size(t.mesh_dim) == 1) continue;
    const double link = model.dims[static_cast<std::size_t>(t.mesh_dim)].bandwidth_gbs;
    if (gbs >= 0 && !(link == gbs)) return false;
    gbs = link;
  }
  return true;
}

// How many placement lists cheapest_chain searches at most: 6 letters on 4 mesh dims (a 3-D
// tensor with a Partial op besides P(sum)), 10 on 3.
inline constexpr int max_chain_states = 1296;

// Whether a plan from base's placements to `b` may pass through P(sum) where neither end holds a
// Partial (not under PlanOptions::exact_values).
constexpr bool sum_transit(const Layout& base, const Placements& b, const PlanOptions& o) {
  return !o.exact_values || has_partial(base.placements()) || has_partial(b);
}

// The letters of a mesh dim's placement in cheapest_chain's lists from base's placements to `b`
// (Replicate, every Shard, P(sum) unless sum_transit says not, the ends' Partials), and how
// many lists they make (capped just past max_chain_states).
struct ChainLetters {
  static constexpr int most = max_tensor_dims + 2 * max_mesh_dims + 2;
  Placement letters[most];
  int count = 0;
  int states = 1;
  constexpr ChainLetters(const Layout& base, const Placements& b, const PlanOptions& o) {
    add(Placement::replicate());
    for (int d = 0; d < base.tensor_ndim(); ++d) add(Placement::shard(d));
    if (sum_transit(base, b, o)) add(Placement::partial(ReduceOp::sum));
    for (int k = 0; k < base.mesh().ndim(); ++k) {
      add(base.placements()[k]);
      add(b[k]);
    }
    for (int k = 0; k < base.mesh().ndim() && states <= max_chain_states; ++k) states *= count;
  }
  constexpr void add(const Placement& p) {
    for (int i = 0; i < count; ++i)
      if (letters[i] == p) return;
    letters[count++] = p;
  }
};

// The chain of single-mesh-dim transitions from base's placements to `b` with the least summed
// step cost (order_step_cost's, with every piece padded to the largest), by A* search over the
// placement lists on the way: each mesh dim Replicate, a Shard of any tensor dim, P(sum) or a
// Partial of `b` or the source, each step a valid group operation (transition_valid_to) that
// makes a Partial only once no other mesh dim holds one of another op that the target does not
// keep (as reductions_first: a reduction runs on real values, not on another op's identity).
// Unlike the order search, a mesh dim may change several times: (S(0), R) -> (S(1), R) of 16
// MiB on 2x8 fills mesh dim 0, chunks mesh dim 1, reduce-scatters an eighth of the tensor over
// mesh dim 0 and gathers over mesh dim 1 (70 us by the default model, where the all-to-all over
// mesh dim 0 takes 101). A step costs what its busiest rank receives with every piece padded to
// the group's largest, in closed form; where every tensor dim divides by the mesh's ranks
// (divides_everywhere) every list is even, every rank alike, and a chain's sum is its plan's
// time or bytes; elsewhere it ranks chains as padded steps would cost them (the plan built from
// the chain pads where that is faster). Chains whose sum reaches `beat` go no further. None (no
// transitions) where no chain beats `beat`, or where the lists number more than
// max_chain_states.
constexpr Transitions cheapest_chain(const Layout& base, const Placements& b, const PlanOptions& o,
                                     double beat) {
  const Placements& a = base.placements();
  const DeviceMesh& mesh = base.mesh();
  const int n = mesh.ndim();
  const ChainLetters chain_letters(base, b, o);
  if (chain_letters.states > max_chain_states) return {};
  const Placement* letters = chain_letters.letters;
  const int count = chain_letters.count, states = chain_letters.states;
  int place[max_mesh_dims] = {};  // place[k]: the weight of mesh dim k's letter
  for (int k = 0, w = 1; k < n; ++k, w *= count) place[k] = w;
  auto letter = [&](const Placement& p) {
    int i = 0;
    while (!(letters[i] == p)) ++i;
    return i;
  };
  auto encode = [&](const Placements& ps) {
    int code = 0;
    for (int k = 0; k < n; ++k) code += letter(ps[k]) * place[k];
    return code;
  };
  // What a step from `from` to `to` on mesh dim k costs where a rank's block has `extent`
  // (`block` elements; every piece padded to the largest): order_step_cost's figure between
  // even layouts, in closed form.
  auto step_us = [&](int k, const Placement& from, const Placement& to, std::int64_t block,
                     const std::int64_t* extent) {
    const int g = mesh.size(k);
    if (g == 1 || from.is_replicate() || to.is_partial()) return 0.0;  // local, or nothing
    std::int64_t recv = 0, messages = g - 1;
    // A member's piece of the block along the tensor dim `to` shards (padded to the largest).
    auto piece = [&] {
      const std::int64_t n = extent[to.dim()];
      return n == 0 ? 0 : block / n * ((n + g - 1) / g);
    };
    if (from.is_shard()) {
      recv = (g - 1) * (to.is_replicate() ? block : piece());  // gather, all-to-all
    } else if (to.is_shard()) {
      recv = (g - 1) * piece();  // reduce-scatter
    } else {  // all-reduce: a reduce-scatter of g balanced pieces and an all-gather of them
      const std::int64_t piece = chunk_range(block, g, 0, ChunkPolicy::balanced).size;
      recv = (g - 1) * piece + block - piece;
      messages = std::int64_t{2} * (g - 1);
    }
    const double bytes = static_cast<double>(recv) * static_cast<double>(base.elem_bytes());
    const double us = o.cost_model.dims[static_cast<std::size_t>(k)].time_us(
        static_cast<double>(messages), bytes);
    return o.objective == Objective::bytes ? bytes + us * 1e-9 : us;
  };
  // A* search: a chain through a list costs at least its sum so far plus `rest` of the list,
  // the least time of the collectives still needed there (under the time objective, else 0).
  // Mesh dim k needs one where its placement is a Partial the target does not keep there, or a
  // Shard of a tensor dim the target neither shards there nor makes Partial: some rank then
  // lacks elements (or contributions) that only ranks of another coordinate along k hold, and
  // only steps of k's groups change that coordinate. Such a step costs at least an all-to-all
  // of the smallest block (the tensor over every rank; a padded block is no smaller) in g - 1
  // messages. The floor is consistent: a step on k that ends k's need is such a collective.
  double floor_us[max_mesh_dims] = {};
  if (o.objective == Objective::time) {
    const double smallest = static_cast<double>(base.global_numel()) /
                            static_cast<double>(mesh.size()) *
                            static_cast<double>(base.elem_bytes());
    for (int k = 0; k < n; ++k) {
      const int g = mesh.size(k);
      floor_us[k] = o.cost_model.dims[static_cast<std::size_t>(k)].time_us(
          g - 1, smallest * static_cast<double>(g - 1) / static_cast<double>(g));
    }
  }
  // need_us[k * count + i]: the floor of mesh dim k with letter i there. Arrays below are set
  // for the first `states` (or n * count) entries before they are read: not cleared.
  double need_us[max_mesh_dims * ChainLetters::most];  // NOLINT: see above
  for (int k = 0; k < n; ++k)
    for (int i = 0; i < count; ++i) {
      const Placement& p = letters[i];
      const bool needs =
          p.is_partial() ? !(p == b[k]) : p.is_shard() && !b[k].is_partial() && !(p == b[k]);
      need_us[k * count + i] = needs ? floor_us[k] : 0;
    }
  auto rest = [&](int s) {
    double us = 0;
    for (int k = 0; k < n; ++k) us += need_us[k * count + s / place[k] % count];
    return us;
  };
  auto op_bit = [](ReduceOp op) { return 1u << static_cast<unsigned>(op); };
  // commuting[x]: the ops that commute with ReduceOp x (ops_commute), as bits.
  unsigned commuting[std::size(all_reduce_ops)] = {};
  for (ReduceOp x : all_reduce_ops)
    for (ReduceOp y : all_reduce_ops)
      if (ops_commute(x, y)) commuting[static_cast<int>(x)] |= op_bit(y);
  constexpr double unreached = 1e300;
  double dist[max_chain_states];     // NOLINT(cppcoreguidelines-init-variables): see above
  double bound[max_chain_states];    // NOLINT(cppcoreguidelines-init-variables): dist + rest
  int from_state[max_chain_states];  // NOLINT(cppcoreguidelines-init-variables): see above
  bool done[max_chain_states];       // NOLINT(cppcoreguidelines-init-variables): see above
  // The lists reached and not yet expanded, a binary heap by bound; slot_of[s]: s's slot (-1:
  // none).
  int heap[max_chain_states];     // NOLINT(cppcoreguidelines-init-variables): see above
  int slot_of[max_chain_states];  // NOLINT(cppcoreguidelines-init-variables): see above
  int open = 0;
  for (int s = 0; s < states; ++s) {
    dist[s] = bound[s] = unreached;
    slot_of[s] = -1;
    done[s] = false;
  }
  auto place_at = [&](int slot, int s) {
    heap[slot] = s;
    slot_of[s] = slot;
  };
  auto sift_up = [&](int slot) {
    const int s = heap[slot];
    while (slot > 0 && bound[heap[(slot - 1) / 2]] > bound[s]) {
      place_at(slot, heap[(slot - 1) / 2]);
      slot = (slot - 1) / 2;
    }
    place_at(slot, s);
  };
  auto pop = [&] {
    const int top = heap[0];
    slot_of[top] = -1;
    const int s = heap[--open];
    int slot = 0;
    while (open > 0) {
      int child = 2 * slot + 1;
      if (child >= open) break;
      if (child + 1 < open && bound[heap[child + 1]] < bound[heap[child]]) ++child;
      if (bound[heap[child]] >= bound[s]) break;
      place_at(slot, heap[child]);
      slot = child;
    }
    if (open > 0) place_at(slot, s);
    return top;
  };
  const int start = encode(a), goal = encode(b);
  dist[start] = 0;
  bound[start] = rest(start);
  place_at(open++, start);
  while (true) {
    if (open == 0) return {};
    const int s = pop();
    if (bound[s] >= beat) return {};
    if (s == goal) break;
    done[s] = true;
    // The list's letters; a rank's elements there; the innermost mesh dim sharding each tensor
    // dim (-1: none); and the ops of the Partials on the mesh dims before each (bit x: ReduceOp
    // x): transition_valid_to from these.
    int digit[max_mesh_dims] = {};
    std::int64_t extent[max_tensor_dims] = {};  // the block's, each piece padded to the largest
    for (int d = 0; d < base.tensor_ndim(); ++d) extent[d] = base.global_shape()[d];
    int innermost[max_tensor_dims] = {};
    for (int d = 0; d < base.tensor_ndim(); ++d) innermost[d] = -1;
    unsigned outer_ops[max_mesh_dims + 1] = {};
    // The ops of the Partials the target does not keep, still to be reduced: a Partial of
    // another op is made only after them.
    unsigned pending = 0;
    for (int k = 0; k < n; ++k) {
      digit[k] = s / place[k] % count;
      const Placement& p = letters[digit[k]];
      outer_ops[k + 1] = outer_ops[k];
      if (p.is_shard()) {
        extent[p.dim()] = (extent[p.dim()] + mesh.size(k) - 1) / mesh.size(k);
        innermost[p.dim()] = k;
      } else if (p.is_partial()) {
        outer_ops[k + 1] |= op_bit(p.reduce_op());
        if (!(p == b[k])) pending |= op_bit(p.reduce_op());
      }
    }
    std::int64_t block = 1;  // a rank's elements there
    for (int d = 0; d < base.tensor_ndim(); ++d) block *= extent[d];
    // A Partial reduced or made on k must commute with every Partial outside it.
    auto passes_outer = [&](int k, const Placement& p) {
      return (outer_ops[k] & ~commuting[static_cast<int>(p.reduce_op())]) == 0;
    };
    for (int k = 0; k < n; ++k) {
      const Placement& from = letters[digit[k]];
      if (from.is_shard() && innermost[from.dim()] != k) continue;  // not k's to remove
      if (from.is_partial() && !passes_outer(k, from)) continue;
      const int at = s - digit[k] * place[k];
      for (int i = 0; i < count; ++i) {
        const Placement& to = letters[i];
        if (i == digit[k] || (from.is_partial() && to.is_partial())) continue;
        if (to.is_shard() && innermost[to.dim()] > k) continue;  // an inner mesh dim cuts it
        if (to.is_partial() && (!passes_outer(k, to) ||
                                (!from.is_partial() && (pending & ~op_bit(to.reduce_op())) != 0)))
          continue;
        const int next = at + i * place[k];
        if (done[next]) continue;
        const double c = dist[s] + step_us(k, from, to, block, extent);
        double ahead = 0;  // rest(next), summed in its order
        for (int j = 0; j < n; ++j) ahead += need_us[j * count + (j == k ? i : digit[j])];
        if (c < dist[next] && c + ahead < beat) {
          dist[next] = c;
          bound[next] = c + ahead;
          if (slot_of[next] < 0) place_at(open++, next);
          sift_up(slot_of[next]);
          from_state[next] = s;
        }
      }
    }
  }
  Transitions out;
  int steps = 0;
  for (int s = goal; s != start; s = from_state[s]) ++steps;
  if (steps > static_cast<int>(Transitions::capacity())) return {};
  out.resize(static_cast<std::size_t>(steps));
  for (int s = goal, i = steps; s != start; s = from_state[s]) {
    const int before = from_state[s];
    int k = 0;  // the mesh dim whose letter the step changes
    while (before / place[k] % count == s / place[k] % count) ++k;
    out[--i] = {k, letters[before / place[k] % count], letters[s / place[k] % count]};
  }
  return out;
}

// Whether the options let the planner pad a step's uneven pieces: always, or automatically
// where that is faster, except under Memory::bounded, where automatic padding pads nothing (a
// padded step stages the group's largest piece for every member, more than the block it
// gathers or scatters).
constexpr bool pads_steps(const PlanOptions& o) noexcept {
  return o.padding == Padding::always ||
         (o.padding == Padding::automatic && o.memory != Memory::bounded);
}

// The mesh dim of the one all-gather (S(i) -> R) that src and dst differ by, without Partial,
// where no other mesh dim of more than one rank cuts tensor dim i; -1 otherwise.
constexpr int lone_gather_dim(const Layout& src, const Layout& dst) {
  const Placements& a = src.placements();
  const Placements& b = dst.placements();
  int k = -1;
  for (int j = 0; j < static_cast<int>(a.size()); ++j) {
    if (a[j].is_partial() || b[j].is_partial()) return -1;
    if (a[j] == b[j]) continue;
    if (k >= 0 || !a[j].is_shard() || !b[j].is_replicate()) return -1;
    k = j;
  }
  if (k < 0) return -1;
  for (int j = 0; j < static_cast<int>(a.size()); ++j)
    if (j != k && src.mesh().size(j) > 1 && a[j].is_shard(a[k].dim())) return -1;
  return k;
}

struct plan_builder {
  // The plan of the transitions `ts`, with costs.
  static constexpr Plan build(const Layout& src, const Layout& dst, const Transitions& ts,
                              const PlanOptions& options, const Plan* incumbent = nullptr,
                              const MeshCoord* probe = nullptr) {
    return build(src, dst, ts, nullptr, {}, options, incumbent, probe);
  }

  // The plan of the transitions `prefix`, then one exchange to `exchange_to` (when given),
  // then the transitions `suffix`, with costs.
  // With an incumbent, costing stops as soon as the plan cannot beat it (then it is pruned),
  // first tried on the rank at `probe` alone (the origin when null); a pruned incumbent is no
  // plan and stops nothing.
  // `by_elements`: the exchange's groups cut their blocks by elements (Step::by_elements).
  static constexpr Plan build(const Layout& src, const Layout& dst, const Transitions& prefix,
                              const Placements* exchange_to, const Transitions& suffix,
                              const PlanOptions& options, const Plan* incumbent = nullptr,
                              const MeshCoord* probe = nullptr, bool by_elements = false) {
    Plan plan(src, dst);
    plan.options_ = options;
    Placements state = src.placements();
    if (!transitions_valid(state, prefix) ||
        !transitions_valid(exchange_to != nullptr ? *exchange_to : state, suffix)) {
      plan.pruned_ = true;  // a step that is not one group operation: never chosen
      return plan;
    }
    add_transitions(plan, state, prefix);
    if (exchange_to != nullptr) {
      Step s;
      s.kind = StepKind::exchange;
      s.before = state;
      s.after = *exchange_to;
      s.by_elements = by_elements;
      plan.steps_.push_back(s);
      state = *exchange_to;
    }
    add_transitions(plan, state, suffix);
    if (!(state == dst.placements())) {
      plan.pruned_ = true;  // not a plan to dst: never chosen
      return plan;
    }
    cost(plan, incumbent != nullptr && !incumbent->pruned_ ? incumbent : nullptr, probe, false);
    // A group cut by elements stages its members' partials of a run beside the whole rows (or
    // packed columns) around it, past the larger end in most cases: counted as not fitting.
    if (!plan.pruned_ && options.memory == Memory::bounded)
      plan.fits_ = blocks_within_ends(plan) && !by_elements;
    return plan;
  }

  // Whether the transitions `ts` are one that turns src's placements into dst's, both even, as
  // one step on a mesh dim of more than one rank (a collective or a local step; a Partial's
  // change of op is two): then build_even_step builds their plan.
  static constexpr bool even_step(const Layout& src, const Layout& dst, const Transitions& ts) {
    if (ts.size() != 1) return false;
    const Transition& t = ts[0];
    return src.mesh().size(t.mesh_dim) > 1 && !(t.from.is_partial() && t.to.is_partial()) &&
           transition_valid(t.mesh_dim, src.placements(), dst.placements()) &&
           t.from == src.placement(t.mesh_dim) && t.to == dst.placement(t.mesh_dim) &&
           is_even(src, src.placements()) && is_even(src, dst.placements());
  }

  // build(src, dst, ts, options) where even_step(src, dst, ts): every rank's figures are the
  // origin's (as cost finds them: an even collective costs every rank the same, an all-reduce
  // the origin the most), found without cost()'s general search.
  static constexpr Plan build_even_step(const Layout& src, const Layout& dst, const Transitions& ts,
                                        const PlanOptions& options) {
    Plan out(src, dst);
    out.options_ = options;
    const Transition& t = ts[0];
    Step s;
    s.kind = step_kind(t.from, t.to);
    s.mesh_dim = t.mesh_dim;
    s.before = src.placements();
    s.after = dst.placements();
    if (moves_data(s.kind)) {
      const MeshCoord origin(static_cast<std::size_t>(src.mesh().ndim()), 0);
      const RankStepCost rc = rank_step_cost(src, s.before, s.after, s.kind, s.mesh_dim, false,
                                             origin, src.local_box(s.before, origin),
                                             src.local_box(s.after, origin), options.cost_model);
      s.bytes_send_max = out.bytes_send_max_ = rc.bytes.send;
      s.bytes_recv_max = out.bytes_recv_max_ = rc.bytes.recv;
      s.est_us = out.est_us_ = rc.us;
    }
    out.steps_.push_back(s);
    out.even_ = true;
    if (options.memory == Memory::bounded) out.fits_ = blocks_within_ends(out);
    return out;
  }

  // The plan chosen among candidates built without the sends of an exchange into a Partial
  // (which no choice reads, and which visit every piece the exchange moves), with them.
  static constexpr void finish(Plan& plan) {
    for (const Step& s : plan.steps_)
      if (s.kind == StepKind::exchange && makes_partial(s.before, s.after)) {
        cost(plan);
        return;
      }
  }

  static constexpr void add_transitions(Plan& plan, Placements& state, const Transitions& ts) {
    for (const Transition& t : ts) {
      auto add = [&](StepKind kind, const Placement& to) {
        Step s;
        s.kind = kind;
        s.mesh_dim = t.mesh_dim;
        s.before = state;
        state[t.mesh_dim] = to;
        s.after = state;
        if (plan.src_.mesh().size(t.mesh_dim) == 1) s.kind = StepKind::identity;
        plan.steps_.push_back(s);
      };
      if (t.from.is_partial() && t.to.is_partial() && !(t.from == t.to)) {
        add(StepKind::all_reduce, Placement::replicate());
        add(StepKind::scale, t.to);
      } else {
        add(step_kind(t.from, t.to), t.to);
      }
    }
  }

  // (loses_on and the helpers below come before cost(), which calls them: clang 14 cannot
  // evaluate a member template defined later in the class in a constant expression.)
  // Whether the plan's time (objective time, padding chosen per step) cannot beat the
  // incumbent's, from one rank alone: each step's time is at least what it costs the rank at
  // `c` padded or exact, whichever is less. Spares a losing candidate the choice of padding,
  // which costs every step on every rank.
  template <class MayPad>
  static constexpr bool loses_on(const Plan& plan, const MeshCoord& c, MayPad may_pad,
                                 const Plan& incumbent) {
    const Layout& base = plan.src_;
    const double limit = time_to_beat(incumbent);
    double us = 0;
    Box have = base.local_box(base.placements(), c);
    for (const Step& s : plan.steps_) {
      if (s.kind == StepKind::identity) continue;
      const Box want = base.local_box(s.after, c);
      if (moves_data(s.kind)) {
        const StepTimes t = step_times(plan, s, c, have, want, may_pad(s));
        us += may_pad(s) && t.padded < t.exact ? t.padded : t.exact;
        if (us > limit) return true;
      }
      have = want;
    }
    return false;
  }

  // Whether step `s` costs the rank at the origin (every coordinate 0) the most, in bytes sent
  // and received and in time: a padded collective moves g-1 of the group's largest piece, an
  // all-reduce g-1 of its block's first (largest) balanced piece and the rest of its block, and
  // every extent of every block is largest at the origin (each nested cut's first piece is its
  // largest, under either chunk policy).
  static constexpr bool costs_most_at_origin(const Step& s) noexcept {
    return s.kind == StepKind::all_reduce || (s.padded && s.kind != StepKind::exchange);
  }

  // The time a candidate must not exceed to beat `incumbent` (objective time).
  static constexpr double time_to_beat(const Plan& incumbent) noexcept {
    return incumbent.est_us() * (1 + 1e-9) + 1e-9;
  }

  // What step `s` of `plan` costs the rank at `c` (blocks `have` before, `want` after) in time,
  // exact and, when `with_padded`, padded.
  struct StepTimes {
    double padded = 0;
    double exact = 0;
  };
  static constexpr StepTimes step_times(const Plan& plan, const Step& s, const MeshCoord& c,
                                        const Box& have, const Box& want, bool with_padded) {
    const Layout& base = plan.src_;
    const CostModel& model = plan.options_.cost_model;
    StepTimes t;
    // An exchange into a Partial: its receives alone (its sends visit every receiver's part).
    t.exact = s.kind == StepKind::exchange && exchange_reduces(s.before, s.after)
                  ? reducing_exchange_cost(base, s.before, s.after, c, model, false, nullptr,
                                           s.by_elements)
                        .us
              : s.kind == StepKind::exchange && makes_partial(s.before, s.after)
                  ? partial_exchange_cost(base, s.before, s.after, c, model, false).us
                  : rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, false, c, have,
                                   want, model)
                        .us;
    if (with_padded)
      t.padded =
          rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, true, c, have, want, model)
              .us;
    return t;
  }

  // cost() where every layout the plan passes through is even and no step is an exchange:
  // every step is a collective that costs every rank the same (an all-reduce the origin the
  // most) or a local step, unpadded, so the origin's figures are the plan's (each step's block
  // before is the one after the step before, where that one moved data).
  static constexpr void cost_even(Plan& plan, const Plan* incumbent) {
    const Layout& base = plan.src_;
    const PlanOptions& o = plan.options_;
    const MeshCoord origin(static_cast<std::size_t>(base.mesh().ndim()), 0);
    plan.bytes_recv_max_ = plan.bytes_send_max_ = 0;
    plan.est_us_ = 0;
    Box have;
    bool known = false;
    for (Step& s : plan.steps_) {
      s.padded = false;
      s.bytes_recv_max = s.bytes_send_max = 0;
      s.est_us = 0;
      if (!moves_data(s.kind)) {
        known = false;
        continue;
      }
      if (!known) have = base.local_box(s.before, origin);
      known = true;
      const Box want = base.local_box(s.after, origin);
      const RankStepCost rc = rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, false,
                                             origin, have, want, o.cost_model);
      s.bytes_send_max = rc.bytes.send;
      s.bytes_recv_max = rc.bytes.recv;
      s.est_us = rc.us;
      plan.bytes_send_max_ = bytes_add(plan.bytes_send_max_, rc.bytes.send);
      plan.bytes_recv_max_ = bytes_add(plan.bytes_recv_max_, rc.bytes.recv);
      have = want;
    }
    for (const Step& s : plan.steps_) plan.est_us_ += s.est_us;
    if (incumbent != nullptr &&
        (o.objective == Objective::bytes ? plan.bytes_recv_max_ > incumbent->bytes_recv_max()
                                         : plan.est_us_ > time_to_beat(*incumbent)))
      plan.pruned_ = true;
  }

  // Fills in each step's padding choice, bytes and time, and the plan's totals. With an
  // incumbent, stops early (marking the plan pruned) as soon as the maxima over the ranks seen
  // so far, or (objective time, uneven steps) the rank at `probe` alone (the origin when null),
  // make it worse than the incumbent under the objective. Without `partial_sends`, an exchange
  // into a Partial counts no sends (finish counts them for the plan chosen).
  static constexpr void cost(Plan& plan, const Plan* incumbent = nullptr,
                             const MeshCoord* probe = nullptr, bool partial_sends = true) {
    const PlanOptions& o = plan.options_;
    const DeviceMesh& mesh = plan.src_.mesh();
    const Layout& base = plan.src_;
    // even[i]: whether the layout before step i (after it, for i = size) is even.
    bool even[max_plan_steps + 1] = {is_even(base, base.placements())};
    bool all_even = even[0];
    bool has_exchange = false;
    for (std::size_t i = 0; i < plan.steps_.size(); ++i) {
      even[i + 1] = is_even(base, plan.steps_[i].after);
      all_even = all_even && even[i + 1];
      has_exchange |= plan.steps_[i].kind == StepKind::exchange;
    }
    plan.even_ = all_even;
    if (all_even && !has_exchange) {
      cost_even(plan, incumbent);
      return;
    }
    const bool pads = pads_steps(o);
    auto may_pad = [&](const Step& s) {
      return moves_data(s.kind) && !all_even && s.kind != StepKind::exchange &&
             s.kind != StepKind::all_reduce && pads;
    };
    const MeshCoord origin(static_cast<std::size_t>(mesh.ndim()), 0);
    if (incumbent != nullptr && o.objective == Objective::time && !all_even &&
        o.padding == Padding::automatic &&
        loses_on(plan, probe != nullptr ? *probe : origin, may_pad, *incumbent)) {
      plan.pruned_ = true;
      return;
    }
    for (Step& s : plan.steps_) {
      s.padded = false;
      s.bytes_recv_max = s.bytes_send_max = 0;
      s.est_us = 0;
      if (!may_pad(s)) continue;
      if (o.padding == Padding::always) {
        s.padded = true;
      } else if (o.objective == Objective::time) {
        // Padded when some rank's exact time exceeds the padded time of the busiest rank, the
        // origin (costs_most_at_origin). The exact times depend only on the rank's blocks, which
        // differ only along mesh dims that shard before or after the step.
        // The origin's blocks, for its padded time and (visited first below) its exact time.
        const Box at_before = base.local_box(s.before, origin);
        const Box at_after = base.local_box(s.after, origin);
        const RankStepCost padded = rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim,
                                                   true, origin, at_before, at_after, o.cost_model);
        bool same[max_mesh_dims] = {};
        for (int k = 0; k < mesh.ndim(); ++k)
          same[k] = !s.before[k].is_shard() && !s.after[k].is_shard();
        // On more than 8 ranks: the origin first (often its exact time decides), then one block
        // pair of each kind (the step is no all-reduce).
        if (visited_coords(mesh, same) > 8) {
          s.padded = padded.us < rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, false,
                                                origin, at_before, at_after, o.cost_model)
                                     .us;
          if (s.padded ||
              for_each_block_shape(base, s.before, s.after, [&](const Box& have, const Box& want) {
                s.padded = s.padded ||
                           padded.us < rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim,
                                                      false, origin, have, want, o.cost_model)
                                           .us;
              }))
            continue;
        }
        for_each_coord_while(mesh, origin, same, [&](const MeshCoord& c) {
          const double exact =
              (c == origin ? rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, false, c,
                                            at_before, at_after, o.cost_model)
                           : rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, false, c,
                                            o.cost_model))
                  .us;
          s.padded = padded.us < exact;
          return !s.padded;
        });
      }
    }
    // A collective between even layouts costs every rank the same (an all-reduce too when its
    // block splits evenly into the group's pieces): rank 0 speaks for all, once. Where every step
    // is such a collective or costs the origin the most (costs_most_at_origin), the origin's
    // figures are the plan's. Otherwise the other steps cost every rank whose coordinates matter:
    // those on mesh dims that shard at some point of the plan (with every piece even and no
    // exchange, cost_even took the plan above).
    bool fixed[max_mesh_dims] = {};
    for (int k = 0; k < mesh.ndim(); ++k) {
      fixed[k] = !base.placement(k).is_shard();
      for (const Step& s : plan.steps_)
        fixed[k] = fixed[k] && !s.after[k].is_shard() &&
                   !(s.kind == StepKind::exchange &&
                     s.after[k].is_partial() !=
                         s.before[k].is_partial());  // the members of
                                                     // its group hold or own different parts
    }
    auto even_collective = [&](std::size_t i) {
      return plan.steps_[i].kind != StepKind::exchange && even[i] && even[i + 1];
    };
    bool at_origin = true;
    for (std::size_t i = 0; i < plan.steps_.size() && at_origin; ++i)
      at_origin = !moves_data(plan.steps_[i].kind) || even_collective(i) ||
                  costs_most_at_origin(plan.steps_[i]);
    plan.bytes_recv_max_ = plan.bytes_send_max_ = 0;
    RankBytes uniform_total;  // what the steps costed at the origin cost every rank (or most)
    bool uniform[max_plan_steps] = {};
    bool any_varies = false;
    for (std::size_t i = 0; i < plan.steps_.size(); ++i) {
      Step& s = plan.steps_[i];
      if (!moves_data(s.kind)) continue;
      if (at_origin || even_collective(i)) {
        const Box have = base.local_box(s.before, origin);
        if (at_origin || s.kind != StepKind::all_reduce ||
            have.numel() % mesh.size(s.mesh_dim) == 0) {
          const RankStepCost rc =
              rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, s.padded, origin, have,
                             base.local_box(s.after, origin), o.cost_model);
          uniform[i] = true;
          uniform_total.send = bytes_add(uniform_total.send, rc.bytes.send);
          uniform_total.recv = bytes_add(uniform_total.recv, rc.bytes.recv);
          s.bytes_send_max = rc.bytes.send;
          s.bytes_recv_max = rc.bytes.recv;
          s.est_us = rc.us;
          continue;
        }
      }
      any_varies = true;
    }
    const bool by_bytes = o.objective == Objective::bytes;
    const double us_limit = incumbent != nullptr ? time_to_beat(*incumbent) : 0;
    // An exchange into or from a Partial is costed for every rank at once (each rank's or
    // group's part found once); a plan whose parts do not fit is no plan. One from a Partial
    // stops as soon as it loses, with the steps costed above.
    RankExchangeCosts partial;  // NOLINT(cppcoreguidelines-pro-type-member-init): written first
    double limit_us = 1e300;
    std::int64_t limit_recv = INT64_MAX;
    if (incumbent != nullptr) {
      if (by_bytes) {
        limit_recv = (incumbent->bytes_recv_max() - uniform_total.recv) / base.elem_bytes();
      } else {
        limit_us = us_limit;
        for (const Step& s : plan.steps_) limit_us -= s.est_us;
      }
    }
    std::size_t partial_step = plan.steps_.size();
    for (std::size_t i = 0; i < plan.steps_.size(); ++i) {
      const Step& s = plan.steps_[i];
      if (s.kind != StepKind::exchange) continue;
      const bool reduces = exchange_reduces(s.before, s.after);
      if (!reduces && !makes_partial(s.before, s.after)) continue;
      if (!(reduces ? reducing_exchange_costs(base, s.before, s.after, o.cost_model, partial,
                                              limit_us, limit_recv, s.by_elements)
                    : partial_exchange_costs(base, s.before, s.after, o.cost_model, partial,
                                             limit_us, limit_recv, partial_sends))) {
        plan.pruned_ = true;
        return;
      }
      partial_step = i;
    }
    // Every later step only adds: the plan cannot beat the incumbent once a rank's bytes so far,
    // or the steps' times so far, exceed the incumbent's.
    auto loses_at = [&](std::int64_t recv, double us) {
      return incumbent != nullptr &&
             (by_bytes ? max_of(plan.bytes_recv_max_, recv) > incumbent->bytes_recv_max()
                       : us > us_limit);
    };
    if (!any_varies) {
      plan.bytes_recv_max_ = uniform_total.recv;
      plan.bytes_send_max_ = uniform_total.send;
    } else {
      // An exchange between even layouts whose cuts nest costs alike the ranks whose blocks
      // relate alike (BlockRelation): one rank of each kind is costed.
      std::size_t related_step = plan.steps_.size();
      BlockRelation relation;
      const int visited = visited_coords(mesh, fixed);
      for (std::size_t i = 0; i < plan.steps_.size() && visited > 4; ++i) {
        const Step& s = plan.steps_[i];
        if (s.kind == StepKind::exchange && !uniform[i] && i != partial_step && even[i] &&
            even[i + 1] && !exchange_reduces(s.before, s.after) &&
            !makes_partial(s.before, s.after)) {
          relation = block_relation(base, s.before, s.after);
          if (relation.usable) related_step = i;
        }
      }
      struct Costed {
        std::int64_t send;
        std::int64_t recv;
        double us;
      };
      KeyedMemo<Costed> costed;
      // The exchange into or from a Partial's figures at rank index `at`, costed above.
      auto partial_at = [&](int at) -> RankStepCost {
        return {{bytes_mul(partial.send[at], base.elem_bytes()),
                 bytes_mul(partial.recv[at], base.elem_bytes())},
                partial.us[at]};
      };
      auto visit = [&](const MeshCoord& c) {
        RankBytes total = uniform_total;
        double us = 0;
        // The rank's block before a step is its block after the one before, when that one was
        // costed here (local and uniform steps compute no blocks).
        Box have;
        bool have_known = false;
        for (std::size_t i = 0; i < plan.steps_.size(); ++i) {
          Step& s = plan.steps_[i];
          if (moves_data(s.kind) && !uniform[i]) {
            RankStepCost rc;
            const std::uint64_t key = i == related_step ? relation.key(c) : 0;
            const Costed* known = i == related_step ? costed.find(key) : nullptr;
            if (known != nullptr) {
              rc.bytes = {known->send, known->recv};
              rc.us = known->us;
              have_known = false;
            } else if (i == partial_step) {  // costed above, for every rank: no blocks
              rc = partial_at(mesh.index(c));
              have_known = false;
            } else {
              if (!have_known) have = base.local_box(s.before, c);
              const Box want = base.local_box(s.after, c);
              rc = rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, s.padded, c, have,
                                  want, o.cost_model);
              if (i == related_step) costed.remember(key, {rc.bytes.send, rc.bytes.recv, rc.us});
              have = want;
              have_known = true;
            }
            total.send = bytes_add(total.send, rc.bytes.send);
            total.recv = bytes_add(total.recv, rc.bytes.recv);
            s.bytes_send_max = max_of(s.bytes_send_max, rc.bytes.send);
            s.bytes_recv_max = max_of(s.bytes_recv_max, rc.bytes.recv);
            s.est_us = rc.us > s.est_us ? rc.us : s.est_us;
          } else if (s.kind != StepKind::identity) {
            have_known = false;
          }
          us += s.est_us;
          if (loses_at(total.recv, us)) {
            plan.pruned_ = true;
            return false;
          }
        }
        plan.bytes_recv_max_ = max_of(plan.bytes_recv_max_, total.recv);
        plan.bytes_send_max_ = max_of(plan.bytes_send_max_, total.send);
        return true;
      };
      // The steps whose cost varies. Where only that exchange does, one rank of each kind speaks
      // for its kind (the maxima are the plan's figures). Where only a collective (no
      // all-reduce) does, on more than 8 ranks, one block pair of each kind speaks for the ranks
      // of its kind.
      std::size_t varying = plan.steps_.size();
      int varying_steps = 0;
      for (std::size_t i = 0; i < plan.steps_.size(); ++i)
        if (moves_data(plan.steps_[i].kind) && !uniform[i]) varying = i, ++varying_steps;
      const bool only_related = varying_steps == 1 && varying == related_step;
      // One rank of a kind's figures for step s, into its maxima.
      auto fold = [](Step& s, const RankStepCost& rc) {
        s.bytes_send_max = max_of(s.bytes_send_max, rc.bytes.send);
        s.bytes_recv_max = max_of(s.bytes_recv_max, rc.bytes.recv);
        s.est_us = rc.us > s.est_us ? rc.us : s.est_us;
      };
      // With the maxima of s, the only step whose cost varies, folded: the plan's figures, and
      // whether it then loses.
      auto settle_loses = [&](const Step& s) {
        plan.bytes_recv_max_ = bytes_add(uniform_total.recv, s.bytes_recv_max);
        plan.bytes_send_max_ = bytes_add(uniform_total.send, s.bytes_send_max);
        double us = 0;
        for (const Step& t : plan.steps_) us += t.est_us;
        return loses_at(plan.bytes_recv_max_, us);
      };
      bool by_kind = false;
      // Where only collectives (no all-reduce) vary, on more than 8 ranks, and perhaps an
      // exchange into or from a Partial, whose figures for every rank are known (costed above):
      // each step's maxima are found without visiting the ranks, a collective's from one block
      // pair of each kind. One varying step's maxima are the plan's figures; the sums of several
      // steps' maxima are where some rank is the busiest of each (no rank's sums exceed them):
      // the origin (its pieces are the largest: so it often is), or one of the first ranks busiest
      // in the exchange. An exchange without Partial among several varying steps is costed by
      // its kinds of rank (for_each_exchange_kind), the busiest of them asked. Otherwise every
      // rank is visited.
      bool collectives = varying_steps > 0 && (visited > 8 || varying_steps == 1);
      std::size_t plain = plan.steps_.size();  // that exchange without Partial
      for (std::size_t i = 0; i < plan.steps_.size() && collectives; ++i) {
        const Step& s = plan.steps_[i];
        const bool kinds_of_exchange =
            visited > 8 && varying_steps > 1 && partial_step == plan.steps_.size() &&
            plain == plan.steps_.size() && s.kind == StepKind::exchange && !uniform[i] &&
            !exchange_reduces(s.before, s.after) && !makes_partial(s.before, s.after) &&
            cut_at_most_once(s.before, s.after);
        if (kinds_of_exchange) plain = i;
        collectives =
            !moves_data(s.kind) || uniform[i] || i == partial_step || kinds_of_exchange ||
            (visited > 8 && s.kind != StepKind::exchange && s.kind != StepKind::all_reduce);
      }
      // What varying step i costs the rank at `c`.
      auto cost_at = [&](std::size_t i, const MeshCoord& c) -> RankStepCost {
        const Step& s = plan.steps_[i];
        if (i == partial_step) return partial_at(mesh.index(c));
        return rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, s.padded, c,
                              o.cost_model);
      };
      auto varies = [&](std::size_t i) { return moves_data(plan.steps_[i].kind) && !uniform[i]; };
      if (collectives) {
        // The origin first, where a losing plan usually loses.
        RankStepCost at_origin[max_plan_steps];
        RankBytes origin_total = uniform_total;
        double us = 0;
        for (std::size_t i = 0; i < plan.steps_.size(); ++i) {
          if (!varies(i)) {
            us += plan.steps_[i].est_us;
            continue;
          }
          at_origin[i] = cost_at(i, origin);
          us += at_origin[i].us;
          origin_total.recv = bytes_add(origin_total.recv, at_origin[i].bytes.recv);
          origin_total.send = bytes_add(origin_total.send, at_origin[i].bytes.send);
        }
        if (loses_at(origin_total.recv, us)) {
          plan.pruned_ = true;
          return;
        }
        by_kind = true;
        // The first ranks of the exchange's kinds busiest in it, receiving and sending.
        constexpr int tries = 4;
        static_vector<MeshCoord, tries> busiest_in[2];  // [0] receiving, [1] sending
        std::int64_t most_in[2] = {-1, -1};
        auto note = [&](int side, std::int64_t bytes, const MeshCoord& c) {
          if (bytes > most_in[side]) most_in[side] = bytes, busiest_in[side].clear();
          if (bytes == most_in[side] && !busiest_in[side].full()) busiest_in[side].push_back(c);
        };
        // (Maxima folded before a fallback are some rank's: the visit below keeps them.)
        for (std::size_t i = 0; i < plan.steps_.size() && by_kind; ++i) {
          if (!varies(i)) continue;
          Step& s = plan.steps_[i];
          if (i == plain) {
            by_kind = for_each_exchange_kind(base, s.before, s.after, [&](const MeshCoord& c) {
              const RankStepCost rc = rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim,
                                                     s.padded, c, o.cost_model);
              fold(s, rc);
              note(0, rc.bytes.recv, c);
              note(1, rc.bytes.send, c);
            });
            continue;
          }
          if (i == partial_step) {
            for (int r = 0; r < mesh.size(); ++r) fold(s, partial_at(r));
            continue;
          }
          by_kind =
              for_each_block_shape(base, s.before, s.after, [&](const Box& have, const Box& want) {
                fold(s, rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, s.padded,
                                       origin, have, want, o.cost_model));
              });
        }
        if (by_kind && varying_steps > 1) {
          // A rank busiest in every step, receiving, and one sending.
          auto busiest_everywhere = [&](const MeshCoord& c, bool recv, bool at_the_origin) {
            for (std::size_t i = 0; i < plan.steps_.size(); ++i) {
              if (!varies(i)) continue;
              const RankBytes b = at_the_origin ? at_origin[i].bytes : cost_at(i, c).bytes;
              if ((recv ? b.recv : b.send) !=
                  (recv ? plan.steps_[i].bytes_recv_max : plan.steps_[i].bytes_send_max))
                return false;
            }
            return true;
          };
          for (const bool recv : {true, false}) {
            bool found = busiest_everywhere(origin, recv, true);
            if (!found && partial_step < plan.steps_.size()) {
              const Step& p = plan.steps_[partial_step];
              const std::int64_t most = recv ? p.bytes_recv_max : p.bytes_send_max;
              for (int r = 0, tried = 0; r < mesh.size() && !found && tried < tries; ++r)
                if (bytes_mul(recv ? partial.recv[r] : partial.send[r], base.elem_bytes()) ==
                    most) {
                  ++tried;
                  found = busiest_everywhere(mesh.coordinate_at(r), recv, false);
                }
            }
            for (const MeshCoord& c : busiest_in[recv ? 0 : 1])
              found = found || busiest_everywhere(c, recv, false);
            by_kind = by_kind && found;
          }
        }
        if (by_kind) {
          RankBytes total = uniform_total;
          double total_us = 0;
          for (std::size_t i = 0; i < plan.steps_.size(); ++i) {
            total_us += plan.steps_[i].est_us;
            if (!varies(i)) continue;
            total.recv = bytes_add(total.recv, plan.steps_[i].bytes_recv_max);
            total.send = bytes_add(total.send, plan.steps_[i].bytes_send_max);
          }
          plan.bytes_recv_max_ = total.recv;
          plan.bytes_send_max_ = total.send;
          if (loses_at(plan.bytes_recv_max_, total_us)) {
            plan.pruned_ = true;
            return;
          }
        }
      }
      // Where only an exchange does (no Partial made or reduced), on more than 8 ranks, with
      // every tensor dim cut at most once each side: one rank of each kind speaks for the ranks
      // of its kind (for_each_exchange_kind). Where a relation was found, only where its kinds
      // are found cheaply (a group of at most 256 coordinates), else the relation's visit costs
      // less.
      if (varying_steps == 1 && visited > 8 && varying != partial_step &&
          plan.steps_[varying].kind == StepKind::exchange) {
        Step& s = plan.steps_[varying];
        by_kind = for_each_exchange_kind(
            base, s.before, s.after,
            [&](const MeshCoord& c) {
              fold(s, rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, s.padded, c,
                                     o.cost_model));
            },
            only_related ? 256 : 4096);
        if (by_kind && settle_loses(s)) {
          plan.pruned_ = true;
          return;
        }
      }
      if (!by_kind)
        for_each_coord_while(mesh, origin, fixed, only_related ? relation.step : every_coord,
                             visit);
    }
    plan.est_us_ = 0;
    for (const Step& s : plan.steps_) plan.est_us_ += s.est_us;
    // With every step costed at the origin, the totals are known only now.
    if (!any_varies && loses_at(plan.bytes_recv_max_, plan.est_us_)) plan.pruned_ = true;
  }

  // The plan of no steps between equal layouts: it moves nothing and needs nothing moved.
  static constexpr Plan unchanged(const Layout& src, const Layout& dst,
                                  const PlanOptions& options) {
    Plan plan(src, dst);
    plan.options_ = options;
    return plan;
  }

  // Whether `s`, a padded all-gather of tensor dim i on mesh dim k, receives on its busiest rank
  // what the rank holding a group's smallest piece lacks: it is the one all-gather the plan's ends
  // differ by, with no other mesh dim cutting dim i (lone_gather_dim: every group gathers all N of
  // it, and its members differ in that piece only), and all the pieces of N but its last, the
  // smallest, are the largest ((g-1) largest = N - smallest; 7 rows over 4: 2, 2, 2, 1), so each
  // group's padded receives, (g-1) largest per element of the other dims, are its smallest piece
  // holder's lack.
  static constexpr bool padded_gather_at_bound(const Plan& plan, const Step& s) {
    if (s.kind != StepKind::all_gather || lone_gather_dim(plan.src_, plan.dst_) != s.mesh_dim)
      return false;
    const Layout& base = plan.src_;
    const int g = base.mesh().size(s.mesh_dim);
    const std::int64_t n = base.global_shape()[s.before[s.mesh_dim].dim()];
    return (g - 1) * chunk_range(n, g, 0, base.policy()).size ==
           n - chunk_range(n, g, g - 1, base.policy()).size;
  }

  // Whether the plan moves no more than the lower bound whatever it is, by its form: it moves
  // nothing, or between layouts without Partial its one step that is not an identity is an
  // unpadded all-gather or all-to-all, or a padded all-gather whose padding its busiest rank
  // lacks anyway (padded_gather_at_bound), or its steps are local chunks and then unpadded
  // all-gathers (each rank receives exactly what its source block lacks of its target block: the
  // group's source blocks tile what its target blocks cover, a gather keeps all it had, and a
  // chunk, the innermost cut of its tensor dim, keeps what the target holds of its block). A plan
  // that is no plan or breaks the memory bound does not.
  // Or it reduces the source's Partials that the target does not keep, after local chunks only,
  // the target making no Partial, and either
  // - it is one all-reduce or reduce-scatter in a group of two members, and the target keeps no
  //   Partial: every rank must receive something of the other part for each element it keeps,
  //   and the reduction's messages are that (a padded piece is its group's largest, which that
  //   piece's holder receives all the same); or
  // - it is one unpadded all-reduce or reduce-scatter per reduced Partial, reduce-scatters only
  //   where there are several or (all-reduces in groups of two aside) where the target keeps a
  //   Partial, with every other mesh dim of more than one rank a shard when they run (so that
  //   each group reduces a block no other holds; replicas could split it), between even
  //   layouts, of blocks that split evenly into the groups' pieces: every rank receives the
  //   reduction bound, (G-1)/G of its first block for the G parts of each element and, for the
  //   all-reduce, as much again to spread it (with C kept classes, C G + G - 2 receives of each
  //   element over C G ranks: 2 (G-1) / G per rank only where G is 2). Whether every layout
  //   it passes through is even, its costing found (Plan::even_).
  static constexpr bool meets_bound(const Plan& plan) {
    if (plan.pruned_ || !plan.fits_) return false;
    if (plan.bytes_recv_max_ == 0) return true;
    const Placements& a = plan.src_.placements();
    const Placements& b = plan.dst_.placements();
    int moving = 0, gathers = 0, chunks = 0, reductions = 0;
    int partials = 0, kept = 0;  // the source's Partials the target does not keep, and keeps
    bool scatters = true, padded = false;
    const Step* first = nullptr;  // the first reduction
    for (std::size_t k = 0; k < a.size(); ++k) {
      if (b[k].is_partial() && !(a[k] == b[k])) return false;
      kept += b[k].is_partial() ? 1 : 0;
      partials += a[k].is_partial() && !b[k].is_partial() ? 1 : 0;
    }
    for (const Step& s : plan.steps_) {
      if (s.kind == StepKind::identity) continue;
      if (s.kind == StepKind::all_reduce || s.kind == StepKind::reduce_scatter) {
        first = first == nullptr ? &s : first;
        ++reductions;
        scatters = scatters && s.kind == StepKind::reduce_scatter;
      } else if (first != nullptr || (s.padded && !padded_gather_at_bound(plan, s)) ||
                 (s.kind == StepKind::chunk
                      ? partials == 0 && moving > 0  // chunks only before the first moving step
                      : partials > 0 ||
                            (s.kind != StepKind::all_gather && s.kind != StepKind::all_to_all))) {
        return false;  // nothing but reductions after the first
      }
      moving += moves_data(s.kind) ? 1 : 0;
      padded = padded || s.padded;
      gathers += s.kind == StepKind::all_gather ? 1 : 0;
      chunks += s.kind == StepKind::chunk ? 1 : 0;
    }
    if (partials == 0)
      return kept == 0 && ((moving == 1 && chunks == 0) || (gathers == moving && !padded));
    if (reductions != partials || moving != reductions || (reductions > 1 && !scatters))
      return false;
    const Layout& base = plan.src_;
    const DeviceMesh& mesh = base.mesh();
    if (reductions == 1 && mesh.size(first->mesh_dim) == 2 && kept == 0) return true;
    if (kept > 0 && !scatters && mesh.size(first->mesh_dim) != 2) return false;
    if (!plan.even_) return false;
    const Placements& at = first->before;
    for (int j = 0; j < mesh.ndim(); ++j)
      if (!a[j].is_partial() && !at[j].is_shard() && mesh.size(j) > 1) return false;
    // A reduce-scatter's block splits evenly: the layout after it is even (its new cut of the
    // scattered dim divides the block's extent there).
    auto splits_evenly = [&](const Step& s) {
      const MeshCoord origin(static_cast<std::size_t>(mesh.ndim()), 0);
      return base.local_box(s.before, origin).numel() % mesh.size(s.mesh_dim) == 0;
    };
    return std::ranges::all_of(plan.steps_, [&](const Step& s) {
      if (s.kind != StepKind::all_reduce && s.kind != StepKind::reduce_scatter) return true;
      return !s.padded && (s.kind == StepKind::reduce_scatter || splits_evenly(s));
    });
  }

  static constexpr bool pruned(const Plan& plan) noexcept { return plan.pruned_; }
  // Whether every layout the plan passes through is even (where it was costed).
  static constexpr bool even(const Plan& plan) noexcept { return plan.even_; }
  static constexpr bool fits(const Plan& plan) noexcept { return plan.fits_; }
  // The plan a candidate must beat to be costed to the end: none while the best so far is no
  // plan (pruned) or breaks the memory bound (then any plan within it is better, however slow).
  static constexpr const Plan* incumbent(const Plan& best) noexcept {
    return best.fits_ && !best.pruned_ ? &best : nullptr;
  }
  // A bar the search's plan must meet to be of use (Memory::automatic's bounded search, whose
  // plan is taken only within memory_slack of the fastest): `plan` with the time (objective time)
  // or the receives (objective bytes) set to the bar and the other unbounded. Stands in as the
  // incumbent (see the overload below), never as a result.
  static constexpr Plan bar(const Plan& plan, double us, std::int64_t recv) noexcept {
    Plan out = plan;
    const bool by_bytes = plan.options_.objective == Objective::bytes;
    out.est_us_ = by_bytes ? 1e300 : us;
    out.bytes_recv_max_ = by_bytes ? recv : INT64_MAX;
    out.fits_ = true;
    out.pruned_ = false;
    return out;
  }
  // The plan a candidate must beat under a bar (null: none): the best so far where it is an
  // incumbent that meets the bar, else the bar.
  static constexpr const Plan* incumbent(const Plan& best, const Plan* bar) noexcept {
    if (bar == nullptr) return incumbent(best);
    const Plan* kept = incumbent(best);
    if (kept == nullptr) return bar;
    const bool within = bar->options_.objective == Objective::bytes
                            ? kept->bytes_recv_max_ <= bar->bytes_recv_max_
                            : kept->est_us_ <= bar->est_us_;
    return within ? kept : bar;
  }

  static constexpr void set_lower_bound(Plan& plan, std::int64_t bytes) noexcept {
    plan.lower_bound_ = bytes;
  }
  // The memory mode asked for, and whether the plan runs under the bound.
  static constexpr void set_memory(Plan& plan, Memory asked, bool bounded) noexcept {
    plan.options_.memory = asked;
    plan.bounded_ = bounded;
  }
  // Whether the plan is one the search under Memory::bounded would take as within the bound:
  // no block between steps larger than both ends (blocks_within_ends), no padded step (its
  // padded pieces are staged, on steps that may not run in bands) and no group's block cut by
  // elements (its partials of a run are staged beside the rows around it). A plan of that
  // search has its fits_ from blocks_within_ends already.
  static constexpr bool holds_bound(const Plan& plan) {
    return plan.fits_ &&
           std::ranges::none_of(plan.steps_,
                                [](const Step& s) { return s.padded || s.by_elements; }) &&
           (plan.options_.memory == Memory::bounded || blocks_within_ends(plan));
  }
};

constexpr bool better(const Plan& a, const Plan& b, Objective objective);

// The fewest elements the rank at `coord` receives in an exchange from `mid` into the Partials
// of `end` (owned_part): its group splits evenly what none of its members holds, so at least the
// floor of the even share.
constexpr std::int64_t partial_share_floor(const Layout& base, const Placements& mid,
                                           const Placements& end, const MeshCoord& coord) {
  const DeviceMesh& mesh = base.mesh();
  bool fixed[max_mesh_dims] = {};
  std::int64_t group = 1;
  for (int k = 0; k < mesh.ndim(); ++k) {
    fixed[k] = !end[k].is_partial() || mid[k].is_partial();
    if (!fixed[k]) group *= mesh.size(k);
  }
  const Box block = base.local_box(end, coord);
  return (block.numel() - union_numel(base, mid, coord, fixed, block)) / group;
}

// The fewest messages the busiest rank of a gather of tensor dim d on mesh dim k receives in
// any order of the transitions `ts` (or an all-to-all from S(d) there): one per other member
// whose piece is not empty. The group holding the first piece of every outer cut holds the
// largest range of d, at least N_d cut by every mesh dim before k that shards d at some point
// (src's placement or a transition's); of any range from that size to N_d, the fewest non-empty
// pieces less one (a member whose own piece is empty receives them all). Without a short answer
// (a large mesh dim under the torch policy), none.
constexpr int gather_messages_floor(const Layout& base, const Transitions& ts, int k, int d) {
  const DeviceMesh& mesh = base.mesh();
  const int g = mesh.size(k);
  const std::int64_t whole = base.global_shape()[d];
  std::int64_t n = whole;
  for (int j = 0; j < k; ++j) {
    bool shards = base.placement(j).is_shard(d);
    for (const Transition& t : ts)
      shards = shards || (t.mesh_dim == j && (t.from.is_shard(d) || t.to.is_shard(d)));
    if (shards) n = chunk_range(n, mesh.size(j), 0, base.policy()).size;
  }
  if (base.policy() == ChunkPolicy::balanced) return (n < g ? static_cast<int>(n) : g) - 1;
  // torch_chunk: ceil(m / ceil(m / g)) pieces of m, not monotone in m, but g from g(g-1) on.
  const std::int64_t all_from = std::int64_t{g} * (g - 1);
  if (n >= all_from) return g - 1;
  if (all_from - n > 64) return 0;
  int fewest = g;
  for (std::int64_t m = n; m < all_from && m <= whole; ++m) {
    const int pieces = nonempty_pieces(m, g, ChunkPolicy::torch_chunk);
    fewest = pieces < fewest ? pieces : fewest;
  }
  return fewest > 0 ? fewest - 1 : 0;
}

// A floor under the time of any plan whose steps include the transitions `ts`, in any order
// and with gathers merged into all-to-alls, from the latency of their messages. Of a tensor that
// is not empty some member of a group has a piece, and it receives g-1 messages in a reduction
// (all-reduce twice; a Partial's change of op is one) even where the step is exact (a
// point-to-point round), so the step's time, its slowest rank's, is at least that. A gather's or
// all-to-all's exact messages may be fewer (one per non-empty piece): g-1 where every tensor dim
// splits evenly into as many pieces as the mesh has ranks, so that every piece of every block is
// non-empty in any order, else gather_messages_floor.
constexpr double latency_floor_us(const Layout& base, const Transitions& ts,
                                  const CostModel& model) {
  if (base.global_numel() == 0) return 0;
  const DeviceMesh& mesh = base.mesh();
  const double collective_factor = least_latency_factor(model);
  bool even = true;
  for (const std::int64_t n : base.global_shape()) even = even && n % mesh.size() == 0;
  double us = 0;
  for (const Transition& t : ts) {
    const int g = mesh.size(t.mesh_dim);
    if (g == 1) continue;
    const StepKind kind = step_kind(t.from, t.to);  // P(a) -> P(b): its all-reduce
    double messages = 0;
    if (kind == StepKind::all_reduce)
      messages = 2.0 * (g - 1);
    else if (kind == StepKind::reduce_scatter)
      messages = g - 1;
    else if (kind == StepKind::all_gather || kind == StepKind::all_to_all)
      messages = even ? g - 1 : gather_messages_floor(base, ts, t.mesh_dim, t.from.dim());
    us += model.dims[t.mesh_dim].latency_us * messages * collective_factor;
  }
  return us;
}

// A floor under the time of every plan from `base` that moves `bound_bytes` (the lower bound):
// some rank receives that many, each byte at best over the fastest link of a mesh dim of more
// than one rank, and where that is any, in at least one message of the least latency (a
// collective's or, where cheaper, a point-to-point one's). A plan's time is the sum of its
// steps', each its slowest rank's, so at least that rank's. 0 where nothing must move, or where
// no link has bandwidth.
constexpr double plan_floor_us(const Layout& base, std::int64_t bound_bytes,
                               const CostModel& model) {
  if (bound_bytes <= 0) return 0;
  const LinkCost fastest = fastest_link(base.mesh(), model);
  const double factor = least_latency_factor(model);
  const LinkCost floor{fastest.latency_us * factor, fastest.bandwidth_gbs};
  if (!(floor.bandwidth_gbs > 0) || floor.latency_us < 0) return 0;
  return floor.time_us(1, static_cast<double>(bound_bytes));
}

// The microseconds step `s` of `plan` spends on bytes over bandwidth: its busiest rank's
// receives over its mesh dim's link (an exchange's over the slowest link); 0 for a local step.
constexpr double step_bandwidth_us(const Plan& plan, const Step& s, const CostModel& model) {
  if (!moves_data(s.kind)) return 0;
  double gbs = 0;
  for (int k = 0; k < plan.src().mesh().ndim(); ++k)
    if (s.kind == StepKind::exchange || k == s.mesh_dim) {
      const double link = model.dims[k].bandwidth_gbs;
      gbs = gbs == 0 || link < gbs ? link : gbs;
    }
  return gbs > 0 ? static_cast<double>(s.bytes_recv_max) / (gbs * 1e3) : 0;
}

// The part of `plan`'s estimated time that is bytes over bandwidth (step_bandwidth_us).
constexpr double bandwidth_us(const Plan& plan, const CostModel& model) {
  double us = 0;
  for (const Step& s : plan) us += step_bandwidth_us(plan, s, model);
  return us;
}

// The mesh dim of the step of `plan` that spends the most on bandwidth (the plan's bottleneck
// collective), or -1 where that is an exchange (over every mesh dim) or the plan moves nothing.
constexpr int busiest_mesh_dim(const Plan& plan, const CostModel& model) {
  int busiest = -1;
  double most = 0;
  for (const Step& s : plan) {
    const double us = step_bandwidth_us(plan, s, model);
    if (us > most) {
      most = us;
      busiest = s.kind == StepKind::exchange ? -1 : s.mesh_dim;
    }
  }
  return busiest;
}

// A floor under the time of an exchange from `mid` to `end` (no Partial) on the rank at `probe`:
// if it lacks elements of its block, those elements at the fastest link's bandwidth and at least
// one point-to-point message, or into no Partial, one from each block of `mid` other than its
// own that holds some of them (the blocks tile the tensor, or each class of a kept Partial's
// ranks: the elements of one come from a rank that holds it, in a message of its own).
constexpr double exchange_floor_us(const Layout& base, const Placements& mid, const Placements& end,
                                   const MeshCoord& probe, const CostModel& model) {
  // An exact step sends no empty message: of an empty tensor, none at all.
  if (base.global_numel() == 0) return 0;
  std::int64_t messages = 1;
  const std::int64_t missing = makes_partial(mid, end)
                                   ? partial_share_floor(base, mid, end, probe)
                                   : missing_elements(base, mid, end, probe, &messages);
  if (missing <= 0) return 0;
  return fastest_p2p_link(base.mesh(), model)
      .time_us(double(messages), double(missing) * double(base.elem_bytes()));
}

// A floor under the time of the plan of the transitions `ts` (from `base`'s placements; they
// make no Partial) followed by an exchange from `mid` to `end`: the transitions' latency floor
// (latency_floor_us) and the exchange's on the rank at `probe` (exchange_floor_us). Lets
// try_exchanges skip candidates without costing them. Where `beat` is given (and the exchange
// makes no Partial), it stops at the first of its cheaper floors that exceeds it: the
// transitions' alone, then with the exchange's counting one message; and where the probe holds
// its target already, on meshes of at most 8 ranks, it takes the most of every rank's floor
// counting one message instead (the probe is at the origin, where the collectives cost the
// most, and another rank may lack its whole block).
constexpr double exchange_plan_floor_us(const Layout& base, const Transitions& ts,
                                        const Placements& mid, const Placements& end,
                                        const MeshCoord& probe, const CostModel& model,
                                        double beat = std::numeric_limits<double>::infinity()) {
  const double us = latency_floor_us(base, ts, model);
  if (us > beat) return us;
  if (beat == std::numeric_limits<double>::infinity() || makes_partial(mid, end) ||
      base.global_numel() == 0)
    return us + exchange_floor_us(base, mid, end, probe, model);
  const LinkCost link = fastest_p2p_link(base.mesh(), model);
  const auto elem = static_cast<double>(base.elem_bytes());
  const Missing m = missing_at(base, mid, end, probe);
  if (m.elements > 0) {
    const double one = us + link.time_us(1, double(m.elements) * elem);
    if (one > beat) return one;
    return us + link.time_us(double(sources_of(base, mid, m)), double(m.elements) * elem);
  }
  // No rank lacks more than the origin's target block (each nested cut's first piece is its
  // largest): where one message of that cannot exceed `beat`, no rank's floor can.
  const MeshCoord origin(static_cast<std::size_t>(base.mesh().ndim()), 0);
  if (base.mesh().size() > 8 ||
      us + link.time_us(1, double(base.local_box(end, origin).numel()) * elem) <= beat)
    return us;
  double most = us;
  const bool fixed[max_mesh_dims] = {};
  for_each_coord_while(base.mesh(), probe, fixed, [&](const MeshCoord& c) {
    const std::int64_t lacks = missing_at(base, mid, end, c).elements;
    const double at = lacks > 0 ? us + link.time_us(1, double(lacks) * elem) : us;
    most = at > most ? at : most;
    return most <= beat;
  });
  return most;
}

// Calls f(cost) for each step of the transitions `ts` (from `base`'s placements) that moves
// data on a mesh dim of more than one rank, where cost(padded) is the rank at `probe`'s
// RankStepCost in it.
template <class F>
constexpr void for_each_probe_step(const Layout& base, const Transitions& ts,
                                   const MeshCoord& probe, const CostModel& model, F&& f) {
  Placements state = base.placements();
  Box have = base.local_box(state, probe);
  for (const Transition& t : ts) {
    Placements next = state;
    next[t.mesh_dim] = t.to;
    const Box want = base.local_box(next, probe);
    const StepKind kind = step_kind(t.from, t.to);  // P(a) -> P(b): its all-reduce
    if (moves_data(kind) && base.mesh().size(t.mesh_dim) > 1)
      f([&](bool padded) {
        return rank_step_cost(base, state, next, kind, t.mesh_dim, padded, probe, have, want,
                              model);
      });
    state = next;
    have = want;
  }
}

// The bytes the rank at `probe` receives in the plan of the transitions `ts` (from `base`'s
// placements), each step exact, as the bytes objective's automatic padding runs them (padded
// ones receive more): with what an exchange after them costs it, a floor under such a plan's
// largest receive that lets try_exchanges skip candidates without costing them under the bytes
// objective.
constexpr std::int64_t probe_bytes(const Layout& base, const Transitions& ts,
                                   const MeshCoord& probe, const CostModel& model) {
  std::int64_t bytes = 0;
  for_each_probe_step(base, ts, probe, model,
                      [&](const auto& cost) { bytes = bytes_add(bytes, cost(false).bytes.recv); });
  return bytes;
}

// A floor under the time the steps of the transitions `ts` (from `base`'s placements) take in
// any plan: the rank at `probe`'s time in each, padded or exact, whichever is less (a step takes
// as long as its slowest rank).
constexpr double probe_floor_us(const Layout& base, const Transitions& ts, const MeshCoord& probe,
                                const CostModel& model) {
  double us = 0;
  for_each_probe_step(base, ts, probe, model, [&](const auto& cost) {
    const double exact = cost(false).us, padded = cost(true).us;
    us += exact < padded ? exact : padded;
  });
  return us;
}

// Whether an exchange from `mid` (no Partial) into `end`'s Partials would move nothing, by their
// form: `mid` is `end` on every other mesh dim, and on each dim where `end` is Partial either
// replicates or shards a tensor dim that no later mesh dim shards unless `end` is Partial there
// too. The members of each group sharing a target block then hold pieces of it that cover it
// (their cuts nest inside the block's), and an exchange gives every element to the first member
// that holds it: that plan is `mid`'s then local fills and scales.
constexpr bool tiles_made_groups(const Placements& mid, const Placements& end) noexcept {
  for (std::size_t k = 0; k < mid.size(); ++k) {
    if (!end[k].is_partial()) {
      if (!(mid[k] == end[k])) return false;
      continue;
    }
    if (mid[k].is_partial()) return false;
    if (!mid[k].is_shard()) continue;
    for (std::size_t j = k + 1; j < mid.size(); ++j)
      if (mid[j].is_shard(mid[k].dim()) && !end[j].is_partial()) return false;
  }
  return true;
}

// Appends to `ts` the local transitions from `from` to each of `to`'s Partials that `from` is
// not already, innermost mesh dim first.
constexpr void append_made_partials(Transitions& ts, const Placements& from, const Placements& to) {
  for (int k = static_cast<int>(to.size()); k-- > 0;)
    if (to[k].is_partial() && !(from[k] == to[k])) ts.push_back({k, from[k], to[k]});
}

// The mesh dims (bits) whose Partial an exchange from `a` toward `b` keeps as it is: each of its
// classes (the ranks that share a coordinate there, holding one part) exchanges its part among
// itself. Those `b` keeps, but not where a Partial inside (a later mesh dim) is reduced or made
// with an op that does not commute with its own (which may not run while it is pending): that
// one is reduced first and made again after.
constexpr unsigned kept_partials(const Placements& a, const Placements& b) {
  unsigned kept = 0;
  for (int k = 0; k < static_cast<int>(a.size()); ++k)
    if (a[k].is_partial() && b[k] == a[k]) kept |= 1u << k;
  // Whether k stays depends only on the dims inside it, so one pass from the innermost outward.
  for (int k = static_cast<int>(a.size()) - 2; k >= 0; --k) {
    if ((kept >> k & 1u) == 0) continue;
    const ReduceOp op = a[k].reduce_op();
    for (int j = k + 1; j < static_cast<int>(a.size()); ++j)
      if ((kept >> j & 1u) == 0 && ((a[j].is_partial() && !ops_commute(a[j].reduce_op(), op)) ||
                                    (b[j].is_partial() && !ops_commute(b[j].reduce_op(), op)))) {
        kept &= ~(1u << k);
        break;
      }
  }
  return kept;
}

// A reduction's choice `choice` of where to leave a mesh dim: 0 Replicate, d + 1 Shard(d).
constexpr Placement replicate_or_shard(int choice) {
  return choice == 0 ? Placement::replicate() : Placement::shard(choice - 1);
}

// Every combination of Replicate or some S(d) (replicate_or_shard; `choices`: the tensor's dims
// and one) on the mesh dims `dims`, while the combinations number at most `most`
// (count_combos), else one: Replicate on each.
struct DimChoices {
  int dims[max_mesh_dims] = {};
  int count = 0;
  int choices = 1;
  int combos = 1;

  constexpr explicit DimChoices(int tensor_dims) : choices(tensor_dims + 1) {}
  constexpr void add(int k) { dims[count++] = k; }
  // Counts the combinations of the dims added.
  constexpr void count_combos(int most) {
    for (int i = 0; i < count && combos <= most; ++i) combos *= choices;
    if (combos > most) combos = 1;
  }
  // `ps` with combination `combo`'s choices on those dims.
  [[nodiscard]] constexpr Placements toward(const Placements& ps, int combo) const {
    Placements t = ps;
    for (int i = 0, rest = combo; i < count; ++i, rest /= choices)
      t[dims[i]] = replicate_or_shard(rest % choices);
    return t;
  }
};

// The Partials of `a` that `b` makes again (another op, or the same one where an exchange cannot
// keep it: kept_partials), where an exchange leaves Replicate or some S(d) and the Partial is made
// from it after: every combination of those choices while there are at most 64.
constexpr DimChoices made_again(const Placements& a, const Placements& b, int tensor_dims) {
  DimChoices again(tensor_dims);
  const unsigned kept = kept_partials(a, b);
  for (int k = 0; k < static_cast<int>(a.size()); ++k)
    if (a[k].is_partial() && b[k].is_partial() && (kept >> k & 1u) == 0) again.add(k);
  again.count_combos(64);
  return again;
}

// The exchange straight from placements `a` of src's tensor (the source's, or those some steps
// left) toward placements `b` (reduce_exchange.hpp): `to` is `b` with `a`'s placements where `b`
// is Partial and `a` is not, those Partials made locally after it by `make` (innermost first).
// Whether it may run: it reduces `a`'s Partials, all of one op, but those `b` keeps as they are
// (reduced_partials), in groups of at most max_reducing_group, on a mesh of at most
// max_partial_exchange_ranks.
constexpr bool reducing_exchange_to(const Layout& src, const Placements& a, const Placements& b,
                                    Placements& to, Transitions& make) {
  to = b;
  make.clear();
  for (int k = static_cast<int>(b.size()); k-- > 0;)
    if (b[k].is_partial() && !a[k].is_partial()) {
      to[k] = a[k];
      make.push_back({k, a[k], b[k]});
    }
  return src.tensor_ndim() > 0 && src.mesh().size() <= max_partial_exchange_ranks &&
         exchange_reduces(a, to) && transitions_valid(to, make) &&
         group_size(src.mesh(), reduced_partials(a, to).dims) <= max_reducing_group;
}

// The same from the source's placements.
constexpr bool reducing_exchange_to(const Layout& src, const Placements& b, Placements& to,
                                    Transitions& make) {
  return reducing_exchange_to(src, src.placements(), b, to, make);
}

// Plans with one exchange: first each source Partial the target does not keep is reduced on its
// own mesh dim (all-reduce to R, or reduce-scatter to some S(d)), after the source's Replicate
// dims are optionally chunked to some S(d) so that the reduction runs on a smaller block; then
// one exchange to an intermediate without Partial but those the target keeps as they are (each
// of their classes exchanges its part among itself); then the target's Partial dims are made
// locally (S or R to P), innermost first, from the intermediate's placement there: the
// source's, or some S(d) so that the group splits the work. Every combination is tried while
// there are at most 64 (a reduction's choices: R and every S(d)); beyond that only the natural
// one (the target's shard, else R, or R where that shard cannot be scattered there; no chunk;
// the source's placement). A candidate whose exchange would move nothing (tiles_made_groups) goes
// to `consider` without it, as transitions (search_plan's, which skips those built already).
template <class Consider>
constexpr void try_exchanges(const Layout& src, const Layout& dst, const PlanOptions& options,
                             const MeshCoord& probe, Plan& best, const Plan* bar, bool from_partial,
                             Consider&& consider) {
  auto beaten = [&] { return plan_builder::incumbent(best, bar); };
  const Placements& a = src.placements();
  const Placements& b = dst.placements();
  int reduced[max_mesh_dims] = {}, made[max_mesh_dims] = {}, chunked[max_mesh_dims] = {};
  int num_reduced = 0, num_made = 0, num_chunked = 0;
  const unsigned kept = kept_partials(a, b);
  for (int k = 0; k < static_cast<int>(a.size()); ++k) {
    if ((kept >> k & 1u) != 0) continue;
    if (a[k].is_partial())
      reduced[num_reduced++] = k;
    else if (b[k].is_partial())
      made[num_made++] = k;
  }
  // Chunking first only shrinks a reduction.
  for (int k = 0; k < static_cast<int>(a.size()) && num_reduced > 0; ++k)
    if (a[k].is_replicate() && !b[k].is_partial() && src.mesh().size(k) > 1)
      chunked[num_chunked++] = k;
  const int choices = src.tensor_ndim() + 1;
  int combos = 1;
  for (int i = 0; i < num_reduced + num_made + num_chunked && combos <= 64; ++i) combos *= choices;
  const bool all = combos <= 64;
  if (!all) combos = 1;
  // Straight into the target's Partials after the reductions (owned_part), where no Partial is
  // kept: the members of each target group split what none of them holds, where an exchange to
  // an intermediate layout and local fills give each member a slice of that layout's cut. Under
  // the time objective it must first pass a floor (the probe's share of what its group lacks),
  // then the probe's receives costed exactly.
  auto into_partial = [&](const Transitions& prefix, const Placements& mid) {
    if (made_partial_op(mid, b) == ReduceOp::avg ||
        src.mesh().size() > max_partial_exchange_ranks || !transitions_valid(a, prefix))
      return;
    // Where that exchange would move nothing, the same plan makes the Partials locally.
    if (tiles_made_groups(mid, b)) {
      Transitions ts = prefix;
      append_made_partials(ts, mid, b);
      consider(ts);
      return;
    }
    if (options.objective == Objective::time && beaten() != nullptr) {
      const CostModel& model = options.cost_model;
      const double beat = plan_builder::time_to_beat(*beaten());
      if (exchange_plan_floor_us(src, prefix, mid, b, probe, model, beat) > beat ||
          exchange_plan_floor_us(src, prefix, mid, mid, probe, model) +
                  partial_exchange_cost(src, mid, b, probe, model, false).us >
              beat)
        return;
    }
    // Under the bytes objective, the probe's receives in the transitions and the exchange must
    // not exceed the best plan's: first with its even share of what its group lacks, then with
    // its exact receives.
    if (options.objective == Objective::bytes && beaten() != nullptr) {
      const std::int64_t before = probe_bytes(src, prefix, probe, options.cost_model);
      const std::int64_t most = beaten()->bytes_recv_max();
      if (bytes_add(before, bytes_mul(partial_share_floor(src, mid, b, probe), src.elem_bytes())) >
              most ||
          bytes_add(
              before,
              bytes_mul(partial_exchange_cost(src, mid, b, probe, options.cost_model, false).recv,
                        src.elem_bytes())) > most)
        return;
    }
    const Placements end = b;  // a local: g++ 12 cannot compare a temporary's address to null
    const Plan p = plan_builder::build(src, dst, prefix, &end, {}, options, beaten(), &probe);
    if (better(p, best, options.objective)) best = p;
  };
  // Into a target without Partials but those kept, that exchange is the one below (its end is
  // the target): tried there alone.
  bool makes_target_partials = false;
  for (int k = 0; k < static_cast<int>(b.size()); ++k)
    makes_target_partials = makes_target_partials || (b[k].is_partial() && (kept >> k & 1u) == 0);
  int prefixes = 1;  // the combinations of the chunked and reduced dims' choices
  for (int i = 0; i < num_reduced + num_chunked && all; ++i) prefixes *= choices;
  // A choice of S(d) where the natural placement is S(d) repeats the combination with choice 0
  // there (a smaller one): its plan is that one's, and unless the best plan changed since, so
  // is the outcome.
  int last_change = -1;
  for (int combo = 0; combo < combos; ++combo) {
    int rest = combo, weight = 1, same_as = combo;
    // The choice of S(d) where S(d) is the natural placement repeats choice 0, except for a
    // reduction, which takes Replicate there.
    auto pick = [&](const Placement& natural, bool reduction = false) {
      if (!all) return natural;
      const int choice = rest % choices;
      rest /= choices;
      Placement picked = choice == 0 ? natural : Placement::shard(choice - 1);
      if (choice != 0 && picked == natural) {
        if (reduction)
          picked = Placement::replicate();
        else
          same_as -= choice * weight;
      }
      weight *= choices;
      return picked;
    };
    Transitions prefix, suffix;
    Placements mid = a;
    for (int i = 0; i < num_chunked; ++i) {
      const int k = chunked[i];
      const Placement to = pick(a[k]);
      if (to == a[k]) continue;
      prefix.push_back({k, a[k], to});
      mid[k] = to;
    }
    for (int i = 0; i < num_reduced; ++i) {
      const int k = reduced[i];
      // A reduction to the target's shard, or to Replicate, or to another shard. Where only the
      // natural choice is tried, one that cannot run here (a later mesh dim shards its tensor
      // dim) all-reduces instead.
      Placement to = pick(b[k].is_shard() ? b[k] : Placement::replicate(), true);
      if (!all && !transition_valid_to(k, mid, to)) to = Placement::replicate();
      prefix.push_back({k, a[k], to});
      mid[k] = to;
    }
    if (makes_target_partials && combo < prefixes && same_as == combo) into_partial(prefix, mid);
    Placements end = mid;
    for (int i = 0; i < num_made; ++i) {
      const int k = made[i];
      end[k] = pick(a[k]);
    }
    for (int k = 0; k < static_cast<int>(b.size()); ++k)
      if (!b[k].is_partial()) end[k] = b[k];
    // Every target Partial is made locally after the exchange, innermost first: on `made`
    // dims from the intermediate's placement, on reduced dims from what the reduction left.
    append_made_partials(suffix, end, b);
    if (same_as != combo && last_change <= same_as) continue;
    if (!transitions_valid(a, prefix) || !transitions_valid(end, suffix) || mid == end) continue;
    if (options.objective == Objective::time && beaten() != nullptr) {
      const double beat = plan_builder::time_to_beat(*beaten());
      if (exchange_plan_floor_us(src, prefix, mid, end, probe, options.cost_model, beat) > beat)
        continue;
    }
    // Under the bytes objective, the probe's receives in the transitions and what it lacks of
    // its block after the exchange (every rank receives exactly that) must not exceed the best
    // plan's.
    if (options.objective == Objective::bytes && beaten() != nullptr &&
        bytes_add(probe_bytes(src, prefix, probe, options.cost_model),
                  bytes_mul(makes_partial(mid, end) ? partial_share_floor(src, mid, end, probe)
                                                    : missing_elements(src, mid, end, probe),
                            src.elem_bytes())) > beaten()->bytes_recv_max())
      continue;
    const Plan p = plan_builder::build(src, dst, prefix, &end, suffix, options, beaten(), &probe);
    if (better(p, best, options.objective)) {
      best = p;
      last_change = combo;
    }
  }
  // Straight from the source's Partials where `from_partial` (reduce_exchange.hpp), last (the
  // costliest to cost, against the best of the others): each group reduces its block in parts
  // cut to what its members keep, then every rank takes its target block from the owners; as it
  // is, and after chunking the source's Replicate dims to the target's shards there (each group
  // then reduces a smaller block). Under the time objective one rank's time must first pass.
  // Where the target is Partial on a dim where the source is not, the exchange keeps the
  // source's placement there and the Partial is made locally after it (S or R to P), innermost
  // first. Where the Partials it would reduce are of more than one op, those outside the
  // innermost run of one op are reduced first on their own mesh dims (`lead`: all-reduce, or
  // reduce-scatter to some S(d); every combination while at most 64, else all-reduces), and the
  // exchange reduces the rest from `start`.
  auto reducing_to = [&](const Transitions& lead, const Placements& start, const Placements& to,
                         const Transitions& make) {
    // After a lead, an exchange that only reduces one mesh dim, where the collective there may
    // run, is tried as that collective: under the time objective instead (fewer messages), under
    // the bytes objective as well (between uneven layouts the exchange may move fewer bytes).
    int differ = 0, at = 0;
    for (int k = 0; k < static_cast<int>(b.size()); ++k)
      if (!(start[k] == to[k])) {
        ++differ;
        at = k;
      }
    if (!lead.empty() && differ == 1 && transition_valid_to(at, start, to[at])) {
      Transitions ts = lead;
      ts.push_back({at, start[at], to[at]});
      for (const Transition& t : make) ts.push_back(t);
      consider(ts);
      if (options.objective == Objective::time) return;
    }
    Transitions chunks = lead;
    Placements chunked = start;
    for (int k = 0; k < static_cast<int>(a.size()); ++k)
      if (a[k].is_replicate() && to[k].is_shard() && src.mesh().size(k) > 1) {
        chunks.push_back({k, a[k], to[k]});
        chunked[k] = to[k];
      }
    const Placements& end = to;
    // Under the time objective, the floors that do not cut a block must pass, the probe's then
    // every rank's (their slowest rounds; the second at least what the probe's group's targets
    // share, shared_targets_floor); then, on the rank that lacks the most outside its
    // group's block (the probe where the bound says which is busiest, often not here), those of
    // its group's rounds, then its own second round exactly.
    const bool timed = options.objective == Objective::time && beaten() != nullptr;
    const unsigned dims = reduced_partials(start, to).dims;
    // The lead's share: the probe's time in it (the exchange must beat what is left), its bytes.
    const double lead_us =
        timed && !lead.empty() ? probe_floor_us(src, lead, probe, options.cost_model) : 0;
    const std::int64_t lead_bytes =
        options.objective == Objective::bytes && beaten() != nullptr && !lead.empty()
            ? probe_bytes(src, lead, probe, options.cost_model)
            : 0;
    for (const bool chunk : {false, true}) {
      if (chunk && (chunks.size() == lead.size() || !transitions_valid(a, chunks))) break;
      const Placements& from = chunk ? chunked : start;
      // Under the bytes objective, a floor first (the chunks receive nothing).
      if (options.objective == Objective::bytes && beaten() != nullptr &&
          bytes_add(lead_bytes, bytes_mul(reducing_exchange_elements_floor(src, from, to, probe),
                                          src.elem_bytes())) > beaten()->bytes_recv_max())
        continue;
      const double beat = timed ? plan_builder::time_to_beat(*beaten()) - lead_us : 0;
      if (timed && beat < 0) continue;
      const CostModel& model = options.cost_model;
      double shared = 0;
      auto at_least_shared = [&](double second) { return second > shared ? second : shared; };
      MeshCoord at = probe;
      if (timed) {
        // One message at least from each other group that holds some of the probe's target.
        std::int64_t groups = 1;
        missing_elements(src, from, to, probe, &groups);
        const RoundFloors quick =
            reducing_exchange_floors(src, from, to, probe, model, false, nullptr, groups);
        if (quick.first + quick.second > beat) continue;
        shared = shared_targets_floor(src, from, to, probe, model);
        if (quick.first + at_least_shared(quick.second) > beat) continue;
        const SlowestFloors slowest = slowest_quick_floors(src, from, to, model);
        if (slowest.floors.first + at_least_shared(slowest.floors.second) > beat) continue;
        if (slowest.floors.second > quick.second) at = slowest.at;
      }
      // Between uneven layouts, also with blocks cut by elements where some group's busiest
      // member receives fewer so (GroupParts::by_elements), looked for over every group once
      // the floors at `at` pass.
      for (const bool by_elements : {false, true}) {
        if (by_elements && is_even(src, from) && is_even(src, to)) break;
        if (timed) {
          const GroupParts parts = group_parts(src, from, to, dims, at, by_elements);
          const RoundFloors floors =
              reducing_exchange_floors(src, from, to, at, model, true, &parts);
          if (floors.first + at_least_shared(floors.second) > beat) continue;
          const ExchangeCost e =
              reducing_exchange_cost(src, from, to, at, model, false, &parts, by_elements);
          const double second = e.us - e.first_round_us;
          if (floors.first + at_least_shared(second > floors.second ? second : floors.second) >
              beat)
            continue;
        }
        if (by_elements && !cuts_by_elements(src, from, to, dims)) break;
        const Plan p = plan_builder::build(src, dst, chunk ? chunks : lead, &end, make, options,
                                           beaten(), &probe, by_elements);
        if (better(p, best, options.objective)) best = p;
      }
    }
  };
  // Where the target makes one of start's Partials again (another op, or the same one where it
  // cannot be kept: kept_partials), the exchange leaves Replicate or some S(d) there (every
  // combination while at most 64, else Replicate) and the Partial is made from it after.
  auto reducing = [&](const Transitions& lead, const Placements& start) {
    const DimChoices again = made_again(start, b, src.tensor_ndim());
    // Under the time objective, not under Memory::bounded, only where a quarter or more of the
    // best plan's time is bandwidth: where latency rules, the exchange's two rounds and the fills
    // after it made no faster plan there (none of 195,000 on 2x4 and 2x2x2), at up to 50% more
    // planning work.
    if (again.count > 0 && options.objective == Objective::time &&
        options.memory != Memory::bounded && !plan_builder::pruned(best) &&
        4 * bandwidth_us(best, options.cost_model) < best.est_us())
      return;
    for (int combo = 0; combo < again.combos; ++combo) {
      Placements to;
      Transitions make;
      if (!reducing_exchange_to(src, start, again.toward(b, combo), to, make)) continue;
      if (again.count > 0) {
        make.clear();
        append_made_partials(make, to, b);
        if (!transitions_valid(to, make)) continue;
      }
      reducing_to(lead, start, to, make);
    }
  };
  if (!from_partial) return;
  reducing({}, a);
  // The leads are not tried under Memory::bounded: the exchange's staging beside the block a
  // lead leaves passes the larger end on the backends (on 2x2x2, their plans took 28 small pairs
  // past it on MPI and 36 more on a backend that packs, planned for it).
  if (options.memory == Memory::bounded) return;
  // The reduced dims outside the innermost run of one op.
  int outer = num_reduced - 1;
  while (outer > 0 && a[reduced[outer - 1]].reduce_op() == a[reduced[num_reduced - 1]].reduce_op())
    --outer;
  if (outer <= 0) return;
  int leads = 1;
  for (int i = 0; i < outer && leads <= 64; ++i) leads *= choices;
  if (leads > 64) leads = 1;
  for (int combo = 0; combo < leads; ++combo) {
    Transitions lead;
    Placements start = a;
    for (int i = 0, rest = combo; i < outer; ++i, rest /= choices) {
      const int k = reduced[i];
      start[k] = replicate_or_shard(rest % choices);
      lead.push_back({k, a[k], start[k]});
    }
    if (transitions_valid(a, lead)) reducing(lead, start);
  }
}

// Whether plan a is better than plan b under the objective.
constexpr bool better(const Plan& a, const Plan& b, Objective objective) {
  constexpr double eps = 1e-9;
  if (plan_builder::pruned(a)) return false;
  if (plan_builder::pruned(b)) return true;
  if (plan_builder::fits(a) != plan_builder::fits(b)) return plan_builder::fits(a);
  if (objective == Objective::bytes && a.bytes_recv_max() != b.bytes_recv_max())
    return a.bytes_recv_max() < b.bytes_recv_max();
  if (a.est_us() < b.est_us() - eps) return true;
  if (a.est_us() > b.est_us() + eps) return false;
  if (a.communication_steps() != b.communication_steps())
    return a.communication_steps() < b.communication_steps();
  return a.bytes_recv_max() < b.bytes_recv_max();
}

constexpr void check_same_tensor(const Layout& src, const Layout& dst) {
  if (!(src.mesh() == dst.mesh()))
    fail<why::layout_mesh_mismatch>(src.mesh().shape(), dst.mesh().shape());
  if (!(src.global_shape() == dst.global_shape()))
    fail<why::layout_shape_mismatch>(src.global_shape(), dst.global_shape());
  if (src.dtype() != dst.dtype())
    fail<why::layout_dtype_mismatch>(name(src.dtype()), name(dst.dtype()));
  if (src.policy() != dst.policy()) fail<why::layout_policy_mismatch>();
}

}  // namespace detail

namespace detail {

// The elements the busiest rank must receive whatever the plan (the rules are at
// lower_bound_elements), and the coordinates of a rank that must receive that many per rank
// (the origin when the reduction bound decides).
struct LowerBound {
  std::int64_t elements = 0;
  MeshCoord busiest;
};

// lower_bound where src and dst differ by one all-gather on mesh dim k (lone_gather_dim): every
// group gathers all N of tensor dim i, so its members lack N less their piece times the other
// dims' extents, which are largest in the origin's group (each cut's first piece is its
// largest). The busiest rank is there, holding the first of the smallest pieces (pieces never
// grow with their index), as visiting every rank in row-major order finds.
constexpr LowerBound lone_gather_bound(const Layout& src, const Layout& dst, int k) {
  const DeviceMesh& mesh = src.mesh();
  LowerBound out{0, MeshCoord(static_cast<std::size_t>(mesh.ndim()), 0)};
  const int i = src.placement(k).dim(), g = mesh.size(k);
  const std::int64_t n = src.global_shape()[i];
  const std::int64_t smallest = chunk_range(n, g, g - 1, src.policy()).size;
  const Box block = dst.local_box(out.busiest);
  std::int64_t rest = 1;
  for (int d = 0; d < src.tensor_ndim(); ++d) rest *= d == i ? 1 : block.shape[d];
  out.elements = bytes_mul(n - smallest, rest);
  if (out.elements > 0)
    out.busiest[k] = static_cast<int>(least_where(0, g - 1, [&](std::int64_t j) {
      return chunk_range(n, g, static_cast<int>(j), src.policy()).size == smallest;
    }));
  return out;
}

constexpr LowerBound lower_bound(const Layout& src, const Layout& dst) {
  const DeviceMesh& mesh = src.mesh();
  if (const int k = lone_gather_dim(src, dst); k >= 0) return lone_gather_bound(src, dst, k);
  LowerBound out{0, MeshCoord(static_cast<std::size_t>(mesh.ndim()), 0)};
  // Coordinates on mesh dims that shard on neither side change nothing; nor do those on a target
  // Partial's dims, whose group splits the work (lower_bound_elements counts over the group).
  bool fixed[max_mesh_dims] = {};
  bool src_holds_all = true;
  for (int k = 0; k < mesh.ndim(); ++k) {
    fixed[k] = (!src.placement(k).is_shard() && !dst.placement(k).is_shard()) ||
               dst.placement(k).is_partial();
    src_holds_all = src_holds_all && src.placement(k).is_replicate();
  }
  if (src_holds_all) return out;  // every rank holds the whole tensor
  // Without Partial, the elements each rank lacks, per tensor dim (missing_elements).
  const bool blocks_only = !has_partial(src.placements()) && !has_partial(dst.placements());
  // Where a source Partial is reduced, every rank's bound grows with its target block, which is
  // largest at the origin (each nested cut's first piece is its largest): one rank speaks.
  bool reduces = false;
  for (int k = 0; k < mesh.ndim(); ++k)
    reduces = reduces || reduces_partial(src.placement(k), dst.placement(k), mesh.size(k));
  // Where every layout is even, a reduction's count (reduction_elements, where it counts) is at
  // least the origin's (lower_bound_elements): (G-1) N / ranks for the share, and for the target
  // block's N R / ranks its G + R - 2 (R >= 2) or G - classes (R = 1) per element, with G >= 2.
  if (reduces && divides_everywhere(src)) {
    out.elements = reduction_elements(src, dst);
    if (out.elements > 0) return out;
  }
  // Between even layouts where, along every tensor dim, one side's cuts are the first of the
  // other's, one side's piece holds the other's on every rank: what a rank lacks is the same on
  // every rank.
  if (reduces || (blocks_only && nested_alike(src, dst))) {
    for (int k = 0; k < mesh.ndim(); ++k) fixed[k] = true;
  }
  auto visit = [&](const MeshCoord& c, std::int64_t e) {
    if (e > out.elements) {
      out.elements = e;
      out.busiest = c;
    }
    return true;
  };
  // Between even layouts whose cuts nest, ranks whose blocks relate alike lack alike
  // (BlockRelation): one of each kind is visited, the first in the order of all.
  BlockRelation relation;
  if (blocks_only && visited_coords(mesh, fixed) > 16)
    relation = block_relation(src, src.placements(), dst.placements());
  // Otherwise, without Partial, on more than 16 ranks: what a rank lacks depends only on its
  // blocks' extents and overlaps, so one rank of each kind (block_kinds, the first of its kind)
  // speaks for its kind; the busiest is the first of the busiest kinds, as visiting all finds.
  BlockKinds kinds;  // NOLINT(cppcoreguidelines-pro-type-member-init): block_kinds writes it
  if (!relation.usable && blocks_only && visited_coords(mesh, fixed) > 16 &&
      block_kinds(src, src.placements(), dst.placements(), false, kinds)) {
    const int nd = src.tensor_ndim();
    MeshCoord c = out.busiest;
    for_each_kind_combination(kinds, nd, [&](const int* pick) {
      std::int64_t want = 1, kept = 1;
      for (int d = 0; d < nd; ++d) {
        const DimExtents& e = kinds.extents[d][pick[kinds.group[d]]];
        want *= e.after;
        kept *= e.overlap;
      }
      kinds.rank_of(pick, c);
      const std::int64_t e = want - kept;
      if (e > out.elements ||
          (e == out.elements && e > 0 && std::ranges::lexicographical_compare(c, out.busiest))) {
        out.elements = e;
        out.busiest = c;
      }
    });
  } else if (relation.usable) {
    KeyedMemo<std::int64_t> lacks;
    for_each_coord_while(mesh, out.busiest, fixed, relation.step, [&](const MeshCoord& c) {
      return visit(c, lacks.value(relation.key(c), [&] {
        return missing_elements(src, src.placements(), dst.placements(), c);
      }));
    });
  } else {
    for_each_coord(mesh, out.busiest, fixed, [&](const MeshCoord& c) {
      visit(c, blocks_only ? missing_elements(src, src.placements(), dst.placements(), c)
                           : lower_bound_elements(src, dst, c));
    });
  }
  if (!blocks_only) {
    const std::int64_t e = reduction_elements(src, dst);
    out.elements = e > out.elements ? e : out.elements;
  }
  return out;
}

}  // namespace detail

// The bytes the busiest rank must receive to turn `src` into `dst`, whatever the plan (the
// rules are at detail::lower_bound_elements).
constexpr std::int64_t lower_bound_bytes_recv_max(const Layout& src, const Layout& dst) {
  detail::check_same_tensor(src, dst);
  const std::int64_t basic = detail::lower_bound(src, dst).elements;
  const std::int64_t kept = detail::kept_partial_elements(src, dst);
  return detail::bytes_mul(kept > basic ? kept : basic, src.elem_bytes());
}

// The cheapest plan (by options.objective) that turns layout `src` into layout `dst` of the
// same tensor on the same mesh. Candidates (docs/planner.md): seed 004's sorted and decomposed
// per-mesh-dim collectives, in its order and the cheapest; the same with all-to-all for changes
// of shard dim; a target Partial scattered first and made last; one direct exchange of exactly
// the missing blocks; reductions scattered and gathered back at the end.
namespace detail {
constexpr Plan plan_redistribute(const Layout& src, const Layout& dst, PlanOptions options,
                                 bool exchange_from_partial);
}  // namespace detail

constexpr Plan plan_redistribute(const Layout& src, const Layout& dst, PlanOptions options = {}) {
  return detail::plan_redistribute(src, dst, options, true);
}

namespace detail {
constexpr Plan search_plan(const Layout& src, const Layout& dst, PlanOptions options,
                           bool exchange_from_partial, const Plan* bar = nullptr,
                           bool* detoured = nullptr, OrderCostMemo* memo = nullptr);

// Calls f(plan) for each plan of one exchange from src straight to dst that the planner may
// build: reducing the source's Partials on the way (reducing_exchange_to; those dst keeps stay
// as they are), or keeping each as it is (kept_partials); dst's other Partials are made locally
// after it, innermost first, each from Replicate or some S(d) that the exchange leaves there
// (every combination of those choices while at most 64 in all, else the source's placement
// where dst makes a Partial the source does not hold, and Replicate where dst makes a source
// Partial again: another op, or the same where it cannot be kept). No block is held between
// steps: the candidates plan_redistribute_for tries last, where the search's plans (cheaper by
// the cost model) hold more scratch than the ends on the backend. None where the exchange would
// move nothing, or without options.allow_exchange. With `lead` (for_each_reducing_lead), those
// steps first and the exchange from the placements they leave.
template <class F>
constexpr void for_each_one_exchange_plan(const Layout& src, const Layout& dst, PlanOptions options,
                                          const Transitions& lead, F&& f) {
  check_same_tensor(src, dst);
  if (!options.allow_exchange || src.tensor_ndim() == 0 ||
      !transitions_valid(src.placements(), lead))
    return;
  if (!options.has_cost_model) options = options.with_cost_model(CostModel::defaults(src.mesh()));
  Placements a = src.placements();
  for (const Transition& t : lead) a[t.mesh_dim] = t.to;
  const Placements& b = dst.placements();
  // The source's Partials dst makes again: of another op, or of the same one where it cannot
  // be kept (kept_partials).
  const unsigned kept = kept_partials(a, b);
  unsigned partials = 0;
  for (int k = 0; k < static_cast<int>(a.size()); ++k)
    if (a[k].is_partial()) partials |= 1u << k;
  const DimChoices again = made_again(a, b, src.tensor_ndim());
  // The mesh dims (of more than one rank) where dst makes a Partial the source does not hold,
  // and every choice of what the exchange leaves there while the combinations (with again's)
  // number at most 64, else the source's placement there.
  DimChoices made(src.tensor_ndim());
  for (int k = 0; k < static_cast<int>(a.size()); ++k)
    if (b[k].is_partial() && !a[k].is_partial() && src.mesh().size(k) > 1) made.add(k);
  made.count_combos(64 / again.combos);
  const std::int64_t bound = lower_bound_bytes_recv_max(src, dst);
  for (int combo = 0; combo < again.combos; ++combo)
    for (int m = 0; m < made.combos; ++m) {
      Placements aim = again.toward(b, combo);
      if (made.combos > 1) aim = made.toward(aim, m);
      Placements to;
      Transitions make;
      // Else one that keeps every Partial of the source as it is.
      if (!reducing_exchange_to(src, a, aim, to, make) && (again.count > 0 || kept != partials))
        continue;
      make.clear();
      append_made_partials(make, to, b);
      if (to == a || !transitions_valid(to, make)) continue;
      Plan plan = plan_builder::build(src, dst, lead, &to, make, options);
      if (plan_builder::pruned(plan)) continue;
      plan_builder::set_lower_bound(plan, bound);
      f(std::move(plan));
    }
}

// The best (by options.objective) of for_each_one_exchange_plan's plans; empty where there is
// none.
constexpr std::optional<Plan> one_exchange_plan(const Layout& src, const Layout& dst,
                                                const PlanOptions& options,
                                                const Transitions& lead = {}) {
  std::optional<Plan> best;
  const Objective objective = options.objective;
  for_each_one_exchange_plan(src, dst, options, lead, [&](Plan plan) {
    if (!best || better(plan, *best, objective)) best = std::move(plan);
  });
  return best;
}

// Calls f(lead) for the steps that reduce the first one or more of src's Partials that dst does
// not keep (kept_partials), outermost first, each on its own mesh dim: an all-reduce, or a
// reduce-scatter to some S(d). Every combination of those choices while they number at most 64
// in all, the fewest Partials first. Each lead is followed by one exchange (one_exchange_plan)
// where plan_redistribute_for finds nothing within the ends: source Partials of ops that do not
// commute, which no one exchange reduces.
template <class F>
constexpr void for_each_reducing_lead(const Layout& src, const Layout& dst, F&& f) {
  const Placements& a = src.placements();
  const unsigned kept = kept_partials(a, dst.placements());
  int reduced[max_mesh_dims] = {};
  int count = 0;
  for (int k = 0; k < static_cast<int>(a.size()); ++k)
    if (a[k].is_partial() && (kept >> k & 1u) == 0 && src.mesh().size(k) > 1) reduced[count++] = k;
  const int choices = src.tensor_ndim() + 1;
  int tried = 0;
  for (int n = 1, combos = choices; n <= count && tried + combos <= 64; ++n, combos *= choices) {
    tried += combos;
    for (int combo = 0; combo < combos; ++combo) {
      Transitions lead;
      for (int i = 0, rest = combo; i < n; ++i, rest /= choices)
        lead.push_back({reduced[i], a[reduced[i]], replicate_or_shard(rest % choices)});
      f(lead);
    }
  }
}

// The bytes of the larger of the source and target blocks of the rank holding the largest: the
// origin's (Layout::max_local_bytes).
constexpr std::int64_t largest_end_bytes(const Layout& src, const Layout& dst) {
  const std::int64_t from = src.max_local_bytes(), to = dst.max_local_bytes();
  return from > to ? from : to;
}

// Whether Memory::automatic seeks the bound for src -> dst: where the largest end reaches
// o.bounded_from_bytes (never where the whole tensor is smaller).
constexpr bool seeks_bound(const Layout& src, const Layout& dst, const PlanOptions& o) {
  return bytes_mul(src.global_numel(), src.elem_bytes()) >= o.bounded_from_bytes &&
         largest_end_bytes(src, dst) >= o.bounded_from_bytes;
}

// plan_redistribute of layouts of the same tensor (check_same_tensor), where Memory::automatic
// seeks the bound (`seek`) or not (then it is Memory::any). Seeking: the fastest plan (Memory::
// any's) where it holds the bound as it is (plan_builder::holds_bound: what the bounded search
// would accept; it then runs bounded) and is not a detour (which the bounded search does not
// try: its collectives on blocks cut by an inner shard may stage more on backends that pack),
// else the bounded search's plan where it holds the bound
// and takes at most memory_slack more time than the fastest (under Objective::bytes: moves no
// more bytes), else the fastest. The plan keeps the options asked for. Both searches share one
// memo of the step costs over many ranks (search_plan).
constexpr Plan plan_redistribute(const Layout& src, const Layout& dst, const PlanOptions& options,
                                 bool exchange_from_partial, bool seek) {
  const Memory asked = options.memory;
  PlanOptions search = options;
  search.memory = asked == Memory::bounded ? Memory::bounded : Memory::any;
  bool detoured = false;
  OrderCostMemo memo;  // NOLINT(cppcoreguidelines-pro-type-member-init): a memo
  Plan plan = search_plan(src, dst, search, exchange_from_partial, nullptr, &detoured, &memo);
  bool bounded = asked == Memory::bounded;
  if (asked == Memory::automatic && seek) {
    bounded = !detoured && plan_builder::holds_bound(plan);
    if (!bounded) {
      search.memory = Memory::bounded;
      const double slow = (1 + options.memory_slack) * plan.est_us();
      // Only a plan within the slack is of use: the search prunes against that bar.
      const Plan bar = plan_builder::bar(plan, slow, plan.bytes_recv_max());
      // The same steps cost the same under either memory (order_step_cost).
      const Plan held = search_plan(src, dst, search, exchange_from_partial, &bar, nullptr, &memo);
      const bool cheap = options.objective == Objective::bytes
                             ? held.bytes_recv_max() <= plan.bytes_recv_max()
                             : held.est_us() <= slow;
      if (cheap && !plan_builder::pruned(held) && plan_builder::holds_bound(held)) {
        plan = held;
        bounded = true;
      }
    }
  }
  plan_builder::set_memory(plan, asked, bounded);
  return plan;
}

// plan_redistribute; `exchange_from_partial`: whether an exchange may reduce the source's
// Partials (two point-to-point rounds in one step, which a batch's rounds do not run).
constexpr Plan plan_redistribute(const Layout& src, const Layout& dst, PlanOptions options,
                                 bool exchange_from_partial) {
  check_same_tensor(src, dst);
  return plan_redistribute(src, dst, options, exchange_from_partial,
                           options.memory == Memory::automatic && seeks_bound(src, dst, options));
}

// The search of plan_redistribute under Memory::any or Memory::bounded. With a `bar`
// (plan_builder::bar), candidates that cannot meet it are pruned as if it were the best plan so
// far, and the plan returned may be pruned (none met it) or not meet it: the caller checks.
// `detoured` (where given) says whether the plan is a detour (candidate 7, never under
// Memory::bounded).
// `memo` (where given) keeps the step costs over many ranks that the order searches work out
// (order_step_cost), for this search and the caller's other one of the same pair.
constexpr Plan search_changed(const Layout& src, const Layout& dst, const PlanOptions& options,
                              bool exchange_from_partial, const Plan* bar, bool* detoured,
                              OrderCostMemo* memo);
constexpr Plan search_plan(const Layout& src, const Layout& dst, PlanOptions options,
                           bool exchange_from_partial, const Plan* bar, bool* detoured,
                           OrderCostMemo* memo) {
  if (!options.has_cost_model) options = options.with_cost_model(CostModel::defaults(src.mesh()));
  if (src.placements() == dst.placements())
    return detail::plan_builder::unchanged(src, dst, options);
  return search_changed(src, dst, options, exchange_from_partial, bar, detoured, memo);
}

// search_plan where the placements differ and the options carry a cost model. Every return is
// of `best`, which the caller's plan then is (no copy of a plan on the way out).
constexpr Plan search_changed(const Layout& src, const Layout& dst, const PlanOptions& options,
                              bool exchange_from_partial, const Plan* bar, bool* detoured,
                              OrderCostMemo* memo) {
  const Placements& a = src.placements();
  const Placements& b = dst.placements();
  const detail::Transitions greedy = detail::reductions_first(a, detail::greedy_transitions(a, b));
  // Without Partial, where the greedy plan gathers and chunks one mesh dim (S(i) -> R -> S(j)),
  // its all-to-all receives from each member, in the same message, the part of what the gather
  // would that lies in its target (padded, a piece of each extent that pads the gathered one),
  // and holds no gathered block between. Between even layouts it meets the bound and ends the
  // search. Between uneven ones under the time objective, where steps may be padded, it takes
  // no longer on any rank: padded, its messages are the gather's in number and class, with no
  // more bytes; exact, an uneven gather's are point to point too; and the planner pads a step
  // where that is faster. There it is built first instead and the gather and chunk never (they
  // cannot beat it; a tie in time and steps, which greedy's order used to win, goes to the
  // all-to-all), directly between even layouts.
  const detail::Transitions merged =
      greedy.size() == 2 && options.allow_all_to_all && !has_partial(a) && !has_partial(b)
          ? detail::with_all_to_all(a, greedy)
          : greedy;
  const bool merges = merged.size() == 1 && greedy.size() == 2;
  const bool merged_even = merges && detail::plan_builder::even_step(src, dst, merged);
  const bool all_to_all_first = merged_even || (merges && options.objective == Objective::time &&
                                                detail::pads_steps(options));
  const detail::Transitions& first = all_to_all_first ? merged : greedy;
  const bool first_even =
      all_to_all_first ? merged_even : detail::plan_builder::even_step(src, dst, greedy);
  // Without Partial between even layouts, where the greedy plan gathers one mesh dim and then
  // chunks another, chunking first gathers a block smaller by the chunk's group size: fewer
  // bytes and less time on every rank that moves any, the order the order search finds. Built
  // first, it meets the bound by its form (meets_bound), and greedy's order is never built (it
  // cannot beat it); where it moves nothing or does not meet the bound, greedy's is built.
  detail::Transitions chunked_first;
  if (!first_even && !all_to_all_first && greedy.size() == 2 && !has_partial(a) &&
      !has_partial(b) && greedy[0].from.is_shard() && greedy[0].to.is_replicate() &&
      greedy[1].from.is_replicate() && greedy[1].to.is_shard() &&
      greedy[0].mesh_dim != greedy[1].mesh_dim && src.mesh().size(greedy[0].mesh_dim) > 1 &&
      src.mesh().size(greedy[1].mesh_dim) > 1 && detail::is_even(src, a) &&
      detail::is_even(src, b)) {
    chunked_first = {greedy[1], greedy[0]};
    if (!detail::transitions_valid(a, chunked_first)) chunked_first.clear();
  }
  Plan best = first_even ? detail::plan_builder::build_even_step(src, dst, first, options)
                         : detail::plan_builder::build(
                               src, dst, chunked_first.empty() ? first : chunked_first, options);
  // The bound, unless the first plan meets it by construction (then it is that plan's bytes).
  bool meets = detail::plan_builder::meets_bound(best);
  if (!chunked_first.empty() && (!meets || best.bytes_recv_max() == 0)) {
    chunked_first.clear();
    best = detail::plan_builder::build(src, dst, first, options);
    meets = detail::plan_builder::meets_bound(best);
  }
  // Whether greedy's transitions were built into a plan (a valid one): others that make the same
  // steps make the same plan.
  const bool greedy_built =
      !all_to_all_first && chunked_first.empty() && !detail::plan_builder::pruned(best);
  const detail::LowerBound lb =
      meets ? detail::LowerBound{0, MeshCoord(static_cast<std::size_t>(src.mesh().ndim()), 0)}
            : detail::lower_bound(src, dst);
  std::int64_t bound =
      meets ? best.bytes_recv_max() : detail::bytes_mul(lb.elements, src.elem_bytes());
  // Candidates are first costed on the rank the bound says is busiest, where a loser loses.
  const MeshCoord& probe = lb.busiest;
  // Whether the best plan so far moves more than the bound, breaks the memory bound, or is none:
  // the searches below run only then.
  auto above_bound = [&] {
    return detail::plan_builder::pruned(best) || best.bytes_recv_max() > bound ||
           !detail::plan_builder::fits(best);
  };
  // The kept Partials' count costs more: only when the first plan does not reach the bound
  // (where it does, the count cannot exceed it).
  if (above_bound()) {
    const std::int64_t kept =
        detail::bytes_mul(detail::kept_partial_elements(src, dst), src.elem_bytes());
    bound = kept > bound ? kept : bound;
  }
  // Where the first plan moves no more than the bound, takes no longer than any plan can
  // (plan_floor_us) and has as few communication steps as any plan of that time (one where
  // something must move, else none), no candidate is better (detail::better): it is the plan.
  if (!above_bound() && best.communication_steps() <= (bound > 0 ? 1 : 0) &&
      best.est_us() <= detail::plan_floor_us(src, bound, options.cost_model) + 1e-9) {
    if (detoured != nullptr) *detoured = false;
    detail::plan_builder::finish(best);
    detail::plan_builder::set_lower_bound(best, bound);
    return best;
  }
  // The plan candidates are costed against: the best so far, or the bar.
  auto beaten = [&] { return detail::plan_builder::incumbent(best, bar); };
  // Under the time objective, transitions whose messages' latency alone takes longer than the
  // best plan so far make no better plan, in any order (latency_floor_us): neither built nor
  // ordered.
  auto latency_loses = [&](const detail::Transitions& ts, const Plan* incumbent) {
    return options.objective == Objective::time && incumbent != nullptr &&
           detail::latency_floor_us(src, ts, options.cost_model) >
               detail::plan_builder::time_to_beat(*incumbent);
  };
  // The transitions built so far (the first plan's and those of `built`, the first 8 built
  // after it): built again, they would make the same plan, which cannot beat the best so far (no
  // better than itself, or than what beat it), so they are not. Where the all-to-all was built
  // first, greedy's gather and chunk count as built: they cannot beat it.
  using Built = detail::static_vector<detail::Transitions, 8>;
  Built built;
  auto already_built = [&](const detail::Transitions& ts) {
    return ts == greedy || (greedy_built && detail::same_steps(ts, greedy)) ||
           (all_to_all_first && ts == merged) || ts == chunked_first ||
           std::ranges::any_of(built, [&](const detail::Transitions& seen) { return seen == ts; });
  };
  // Each candidate is costed against the best so far (and stops as soon as it cannot beat it).
  int improvements = 0;  // how often a candidate became the best
  auto consider = [&](const detail::Transitions& ts) {
    if (already_built(ts)) return;
    if (built.size() < Built::capacity()) built.push_back(ts);
    const Plan* incumbent = beaten();
    if (latency_loses(ts, incumbent)) return;
    const Plan p = detail::plan_builder::build(src, dst, ts, options, incumbent, &probe);
    if (detail::better(p, best, options.objective)) {
      best = p;
      ++improvements;
    }
  };
  // The same transitions with all-to-alls where they fit.
  auto consider_all_to_all = [&](const detail::Transitions& ts) {
    if (!options.allow_all_to_all) return;
    const detail::Transitions a2a = detail::with_all_to_all(a, ts);
    if (a2a.size() != ts.size()) consider(a2a);
  };
  // The cheapest order of the same transitions, and of them with reduce-scatters split into
  // all-reduce and chunk, with all-to-alls where they fit; not needed when seed 004's order
  // already moves no more than the bound.
  auto consider_order = [&](const detail::Transitions& ordered) {
    consider(ordered);
    consider_all_to_all(ordered);
  };
  // The same for transitions not yet ordered: their cheapest order, unless they cannot win.
  // With `cut` (the detours), the search stops early where it finds every order slower than the
  // best plan so far (cheapest_order's `beat`).
  auto consider_cheapest_order = [&](const detail::Transitions& ts, bool cut = false) {
    const Plan* incumbent = beaten();
    if (latency_loses(ts, incumbent)) return;
    if (!cut) {
      consider_order(
          detail::cheapest_order(src, ts, options, std::numeric_limits<double>::infinity(), memo));
      return;
    }
    const detail::Transitions ordered = detail::cheapest_order<true>(
        src, ts, options,
        incumbent != nullptr ? detail::plan_builder::time_to_beat(*incumbent)
                             : std::numeric_limits<double>::infinity(),
        memo);
    if (!ordered.empty()) consider_order(ordered);
  };
  // Under the time objective also where greedy's plan meets the bound: its order moves the same
  // bytes in any order, but not over the same links. (S(1), S(0)) -> (R, R) of 16 MiB on 2x8
  // gathers over mesh dim 0 first, a sixteenth of the block over the slow link where seed 004's
  // order gathers half of it there, 94 against 233 us by the default model.
  // Where no order of greedy's transitions can be faster than another at the bound
  // (detail::order_cannot_pay; no two share a mesh dim, so none merge into an all-to-all), the
  // best plan stays one of their orders until the candidates below, and once it is at the bound
  // no other order is searched for. Nor, then, greedy's reduce-scatters split into all-reduce and
  // chunk (twice the reduce-scatter's messages, as many communication steps) or its reductions
  // scattered and gathered last (further below: a reduce-scatter and an all-gather pay the
  // all-reduce's messages, in one more step): their orders pay at least greedy's latency, the
  // bound's bytes make them no faster, and a tie in time has more steps or no fewer bytes.
  const bool greedy_orders =
      !all_to_all_first && detail::order_cannot_pay(src, greedy, options.cost_model);
  bool greedy_settled = greedy_orders && !above_bound();
  if (!greedy_settled && (above_bound() || options.objective == Objective::time)) {
    // The first plan's time is greedy's order's summed step cost where it is greedy's plan, every
    // layout even (the steps costed as the order search costs them) and time the objective.
    const double own = best.est_us();
    const bool own_known =
        greedy_built && options.objective == Objective::time && detail::plan_builder::even(best);
    const detail::Transitions ordered =
        detail::cheapest_order(src, greedy, options, std::numeric_limits<double>::infinity(), memo,
                               own_known ? &own : nullptr);
    if (!(ordered == greedy)) consider_order(ordered);
    greedy_settled = greedy_orders && !above_bound();
    const detail::Transitions split = detail::split_reduce_scatters(greedy);
    if (!greedy_settled && split.size() != greedy.size()) consider_cheapest_order(split);
  }
  if (detail::mixed_partials(a, b)) consider(detail::reduce_all_first(a, b));
  // One transition merges with none; the all-to-all built first is that of greedy.
  if (greedy.size() > 1 && !all_to_all_first) consider_all_to_all(greedy);
  // The target's Partials that the source has (of the same op or another) or makes from
  // Replicate, on mesh dims of more than one rank.
  int partial_dims[max_mesh_dims] = {};
  int partials = 0;
  for (int k = 0; k < static_cast<int>(a.size()); ++k)
    if ((a[k].is_partial() || a[k].is_replicate()) && b[k].is_partial() && src.mesh().size(k) > 1)
      partial_dims[partials++] = k;
  // Then those the source shards along a tensor dim that an inner mesh dim shards in the target:
  // there the fill cannot run where the greedy order puts it (the inner shard's pieces would
  // change meaning), and greedy gathers or exchanges around it. Moving the shard to another
  // tensor dim first (an all-to-all on mesh dim k), or keeping it, and filling last can be
  // faster: (S(0), P(sum)) -> (P(max), S(0)) on 2x4 all-to-alls mesh dim 0 to S(1),
  // reduce-scatters mesh dim 1 and fills mesh dim 0, 8 us by the default model where the
  // reduce-scatter and exchange took 10. Only in the form for one Partial (the several-Partials
  // form below keeps its tensor-dim choices for the others).
  int one_at_a_time = partials;
  for (int k = 0; k < static_cast<int>(a.size()); ++k)
    if (a[k].is_shard() && b[k].is_partial() && src.mesh().size(k) > 1 &&
        !detail::innermost_shard(b, k, a[k].dim()))
      partial_dims[one_at_a_time++] = k;
  // Each of them reduce-scattered, chunked or all-to-all'd first (or kept, a shard of that
  // dim) and made last, over every choice of the tensor dim.
  for (int i = 0; i < one_at_a_time; ++i) {
    const int k = partial_dims[i];
    for (int d = 0; d < src.tensor_ndim(); ++d) {
      if (!above_bound()) break;
      const detail::Transitions scattered = detail::scatter_target_partial(a, b, k, d);
      consider_cheapest_order(scattered);
      // (Not for a Shard source: there the form below found no better plan in 30,000 random
      // pairs.)
      if (i >= partials) continue;
      // Where the shard on mesh dim k must go back through Replicate in between (another mesh
      // dim's shard nests before it in the target), making the Partial earlier may spare that.
      int on_k = 0;
      for (const detail::Transition& t : scattered) on_k += t.mesh_dim == k ? 1 : 0;
      if (on_k > 2 && above_bound())
        consider_cheapest_order(detail::shard_then_make_partial(a, b, k, d));
    }
  }
  // Several of them: all at once, over every choice of their tensor dims (at most 16 choices).
  if (partials >= 2 && above_bound())
    detail::for_each_dim_choice(partials, src.tensor_ndim(), [&](const int* dims) {
      consider_cheapest_order(detail::scatter_target_partials(a, b, partial_dims, dims, partials));
      return above_bound();
    });
  // An exchange moves no fewer bytes than the bound and pays point-to-point latency: only
  // worth trying when the collectives move more.
  if (options.allow_exchange && !(a == b) && above_bound())
    detail::try_exchanges(src, dst, options, probe, best, bar, exchange_from_partial, consider);
  // Under the time objective a plan at the bound is not yet the fastest: an exchange that
  // reaches it (each rank receiving what it lacks, point to point) can be slower than the
  // collectives below that reach it too, e.g. (P, P) -> (R, R) on 4x3, so they run (their
  // latency floor prunes them where they cannot win).
  const bool timed = options.objective == Objective::time;
  if (!greedy_settled && (above_bound() || timed)) {
    // Several reductions to Replicate: reduce-scatter them all, gather back at the end, over
    // every choice of the scattered tensor dims (at most 16 choices).
    int reductions = 0, collectives = 0;
    for (const detail::Transition& t : greedy) {
      reductions += t.from.is_partial() && t.to.is_replicate() ? 1 : 0;
      collectives += moves_data(detail::step_kind(t.from, t.to)) ? 1 : 0;
    }
    // One all-reduce alone is its reduce-scatter and all-gather already.
    if (reductions >= 1 && collectives >= 2)
      detail::for_each_dim_choice(reductions, src.tensor_ndim(), [&](const int* dims) {
        // The order search for several reductions (their scattered blocks nest); one is
        // reduce-scattered in place and gathered last.
        const detail::Transitions scattered = detail::scatter_reductions(greedy, dims);
        if (reductions >= 2)
          consider_cheapest_order(scattered);
        else
          consider_order(scattered);
        return above_bound() || timed;
      });
  }
  // Where the target's inner shards of d block the fill of mesh dim k, the same with them on
  // another tensor dim in between (scatter_target_partial with e). Last, so that a slower plan
  // of this form that reaches the byte bound cannot end the search before an exchange (which
  // stops at that bound) or a reduction form finds a faster one.
  if (above_bound() || timed)
    for (int i = 0; i < one_at_a_time; ++i)
      for (int d = 0; d < src.tensor_ndim(); ++d)
        if (!detail::innermost_shard(b, partial_dims[i], d))
          for (int e = 0; e < src.tensor_ndim() && (above_bound() || timed); ++e)
            if (e != d)
              consider_cheapest_order(detail::scatter_target_partial(a, b, partial_dims[i], d, e));
  // Under the time objective, where a quarter of the best plan's time or more is bandwidth (a
  // detour adds steps, whose latency a plan bound by latency does not repay), a detour on each
  // mesh dim of more than one rank through each shard and P(sum) (detail::detour). Not under
  // Memory::bounded: a detour's collectives on blocks cut by an inner shard pack more on
  // backends that pack (the bound holds the blocks between steps, not that staging).
  const int before_detours = improvements;
  // In their cheapest order where they are few (the order search costs 2^t t steps).
  const auto try_detour = [&](const detail::Transitions& ts, std::size_t searched = 5) {
    if (ts.size() <= searched)
      consider_cheapest_order(ts, true);
    else
      consider_order(ts);
  };
  // Whether a plan of more steps than the best so far may be kept: the time objective, not
  // Memory::bounded, and a best plan to beat.
  const auto longer_may_pay = [&] {
    return timed && options.memory != Memory::bounded && !detail::plan_builder::pruned(best);
  };
  const auto detours_may_pay = [&] {
    return longer_may_pay() && best.est_us() > 0 &&
           4 * detail::bandwidth_us(best, options.cost_model) >= best.est_us();
  };
  const bool may_pay = detours_may_pay();
  // On a mesh of two or more dims, where the placement lists number at most max_chain_states:
  // the cheapest chain of single-mesh-dim steps (detail::cheapest_chain) instead, which every
  // detour is one of (between even layouts it is the fastest plan of them all; between uneven
  // ones, ranked with padded steps, it found every plan the detours did on 60,000 random
  // pairs). It costs less than the detours it replaces (the A* floor and the time to beat cut
  // most lists) and finds chains they miss. On three or more mesh dims also where latency
  // rules: there fewer messages in another order can pay ((P(max), P(max), P(max)) ->
  // (P(sum), P(sum), P(max)) on 2x2x2 reduce-scatters two mesh dims, not three: 4 us by the
  // default model against 6), and on two (most plans) it rarely does.
  const bool chains = src.mesh().ndim() >= 2 &&
                      (may_pay || (src.mesh().ndim() >= 3 && longer_may_pay())) &&
                      detail::ChainLetters(src, b, options).states <= detail::max_chain_states;
  if (chains) {
    const Plan* incumbent = beaten();
    const detail::Transitions chain =
        detail::cheapest_chain(src, b, options,
                               incumbent != nullptr ? detail::plan_builder::time_to_beat(*incumbent)
                                                    : std::numeric_limits<double>::infinity());
    if (!chain.empty()) consider(chain);
  }
  if (may_pay && !chains) {
    // A detour on j where no other mesh dim moves is two steps on j's group where one would do.
    int moving = 0;  // mesh dims of more than one rank that the plan changes
    for (int k = 0; k < static_cast<int>(a.size()); ++k)
      moving += !(a[k] == b[k]) && src.mesh().size(k) > 1 ? 1 : 0;
    for (int j = 0; j < static_cast<int>(a.size()); ++j) {
      if (src.mesh().size(j) == 1 || moving == (a[j] == b[j] ? 0 : 1)) continue;
      for (int e = 0; e <= src.tensor_ndim(); ++e) {
        if (e == src.tensor_ndim() && !detail::sum_transit(src, b, options)) continue;
        const Placement m =
            e < src.tensor_ndim() ? Placement::shard(e) : Placement::partial(ReduceOp::sum);
        if (m == a[j] || m == b[j] || (a[j].is_partial() && m.is_partial())) continue;
        const detail::Transitions detour = detail::detour(a, b, {j}, m);
        try_detour(detour);
        const detail::Transitions shorter = detail::detour_without_undo(detour, a, j);
        if (!shorter.empty()) try_detour(shorter);
        // Where the moves in between take m off j and put it back, j may instead end earlier.
        if (std::ranges::count_if(detour,
                                  [&](const detail::Transition& t) { return t.mesh_dim == j; }) > 2)
          try_detour(detail::detour(a, b, {j}, m, true));
      }
    }
  }
  // And on two mesh dims at once through the same shard, both of them not
  // the mesh dim of the best plan's bottleneck collective (which they would shrink the block
  // of), on meshes of three or more dims (on two, that is every mesh dim). Both forms, in their
  // cheapest order up to 6 transitions.
  if (!chains && a.size() >= 3 && detours_may_pay()) {
    const int busiest = detail::busiest_mesh_dim(best, options.cost_model);
    for (int j1 = 0; j1 < static_cast<int>(a.size()); ++j1)
      for (int j2 = j1 + 1; j2 < static_cast<int>(a.size()); ++j2) {
        if (src.mesh().size(j1) == 1 || src.mesh().size(j2) == 1 || j1 == busiest || j2 == busiest)
          continue;
        for (int e = 0; e < src.tensor_ndim(); ++e) {
          const Placement m = Placement::shard(e);
          if ((m == a[j1] && m == b[j1]) || (m == a[j2] && m == b[j2]) ||
              (m == a[j1] && m == a[j2]))
            continue;
          const detail::Transitions pair = detail::detour(a, b, {j1, j2}, m);
          try_detour(pair, 6);
          const detail::Transitions first = detail::detour(a, b, {j1, j2}, m, true);
          if (!(first == pair)) try_detour(first, 6);
        }
      }
  }
  if (detoured != nullptr) *detoured = improvements != before_detours;
  if (detail::plan_builder::pruned(best)) {
    if (bar != nullptr) return best;
    detail::fail<detail::why::no_valid_plan>();
  }
  detail::plan_builder::finish(best);
  detail::plan_builder::set_lower_bound(best, bound);
  return best;
}
}  // namespace detail

// Whether, on every rank, no block the plan holds between its steps (local steps in a row
// counting as one) is larger than the larger of that rank's source and target blocks: what
// Memory::bounded asks for.
constexpr bool blocks_within_ends(const Plan& plan) { return detail::blocks_within_ends(plan); }

// The bytes global rank `rank` sends and receives in step `i` of the plan.
constexpr RankBytes step_rank_bytes(const Plan& plan, std::size_t i, int rank) {
  const Step& s = plan[i];
  const MeshCoord c = plan.src().mesh().coordinate(rank);
  return detail::rank_step_cost(plan.src(), s, c, plan.cost_model()).bytes;
}

// The bytes global rank `rank` sends and receives over the whole plan.
constexpr RankBytes rank_bytes(const Plan& plan, int rank) {
  RankBytes total;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const RankBytes b = step_rank_bytes(plan, i, rank);
    total.send = detail::bytes_add(total.send, b.send);
    total.recv = detail::bytes_add(total.recv, b.recv);
  }
  return total;
}

// The placements a gradient flows back to (seed 004's Redistribute.backward): the forward
// source's, except that a Partial there becomes Replicate unless the gradient is Partial too.
constexpr Placements gradient_target(const Placements& forward_src, const Placements& grad) {
  Placements out = forward_src;
  for (std::size_t k = 0; k < out.size(); ++k)
    if (forward_src[k].is_partial() && !grad.at(k).is_partial()) out[k] = Placement::replicate();
  return out;
}

// The gradient plan of the redistribution src -> dst (PyTorch's semantics): the gradient, laid
// out with `grad_placements` (by default the forward target's), back to the forward source's
// placements (see gradient_target).
constexpr Plan plan_backward(const Layout& src, const Layout& dst,
                             const Placements& grad_placements, PlanOptions options = {}) {
  detail::check_same_tensor(src, dst);
  if (grad_placements.size() != dst.placements().size())
    detail::fail<detail::why::placement_count_mismatch>(grad_placements.size(), dst.mesh().ndim());
  return plan_redistribute(dst.with_placements(grad_placements),
                           src.with_placements(gradient_target(src.placements(), grad_placements)),
                           options);
}
constexpr Plan plan_backward(const Layout& src, const Layout& dst, PlanOptions options = {}) {
  return plan_backward(src, dst, dst.placements(), options);
}

// The dual of a placement under the local-buffer inner product: Replicate and Partial(sum)
// swap, Shard stays. Other Partial ops are not linear maps with a transpose of this form.
constexpr Placement dual(const Placement& p) {
  if (p.is_replicate()) return Placement::partial(ReduceOp::sum);
  if (p.is_partial(ReduceOp::sum)) return Placement::replicate();
  if (p.is_partial()) detail::fail<detail::why::adjoint_nonlinear>(name(p.reduce_op()));
  return p;
}
constexpr Placements dual(const Placements& ps) {
  Placements out;
  for (const Placement& p : ps) out.push_back(dual(p));
  return out;
}

// The adjoint (transpose) of plan_redistribute(src, dst) as a map of local buffers:
// plan_redistribute(dual(dst), dual(src)). All-gather and reduce-scatter swap, all-reduce
// stays, chunk and fill swap, all-to-all(i -> j) becomes all-to-all(j -> i).
constexpr Plan plan_adjoint(const Layout& src, const Layout& dst, PlanOptions options = {}) {
  detail::check_same_tensor(src, dst);
  return plan_redistribute(dst.with_placements(dual(dst.placements())),
                           src.with_placements(dual(src.placements())), options);
}
// The adjoint of a plan: the plan between the duals of its layouts, reversed.
constexpr Plan adjoint(const Plan& plan) {
  return plan_adjoint(plan.src(), plan.dst(), plan.options());
}

}  // namespace dtensor
