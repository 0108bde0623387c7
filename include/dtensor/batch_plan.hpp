#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "config.hpp"
#include "cost_model.hpp"
#include "detail/checked.hpp"
#include "detail/static_vector.hpp"
#include "detail/step_cost.hpp"
#include "detail/why.hpp"
#include "errors.hpp"
#include "layout.hpp"
#include "plan.hpp"
#include "planner.hpp"

// Batched plans: many tensors of one mesh redistributed together, one collective per round
// instead of one per tensor and step. Constexpr and allocation-free, like the single plan.
namespace dtensor {

// One tensor of a batch: its layout before and after.
struct Redistribution {
  Layout src;
  Layout dst;
};

// How plan_batch groups the tensors' steps into rounds.
enum class BatchSchedule : std::uint8_t {
  // Greedy rounds: collectives fused wherever the tensors' steps match, point-to-point rounds
  // only for steps that move exact sizes.
  fused,
  // Never more backend calls than the tensor whose plan makes the most alone: the greedy
  // rounds unless they make more, then aligned rounds (the r-th steps of all tensors together,
  // as one point-to-point round where they differ). On MPI over shared memory here
  // (bench/README.md) it beats the fused collectives on batches of 4 KiB-256 KiB reductions
  // and mixed steps, and is even or slower on 256 B-16 KiB ones.
  fewest_calls,
};

// How many tensors a BatchPlan holds unless told otherwise (BatchPlan<N>, plan_batch<N>).
inline constexpr std::size_t default_batch_capacity = 64;

// One round of a batched plan: a single collective that moves the steps of several tensors at
// once, packed into one buffer per peer. `kind` is the collective (all_gather, reduce_scatter,
// all_reduce, all_to_all on `mesh_dim`) or `exchange`: one grouped point-to-point round that
// carries every step moved by messages (exchanges, uneven gathers, reduce-scatters and
// all-to-alls with exact sizes, and in an aligned schedule every collective step of a round
// whose steps differ; see BatchPlan::point_to_point). Reductions fuse only steps of one dtype
// and op.
struct BatchRound {
  StepKind kind = StepKind::exchange;
  int mesh_dim = -1;
  DType dtype = DType::u8;      // the reduction's dtype (u8 for rounds that only move bytes)
  ReduceOp op = ReduceOp::sum;  // the reduction's op
  int tensors = 0;              // how many tensors' steps it moves
  std::int64_t bytes_recv_max = 0;
  std::int64_t bytes_send_max = 0;
  double est_us = 0;  // one latency (the largest of its steps') plus every step's bandwidth term
  friend constexpr bool operator==(const BatchRound&, const BatchRound&) noexcept = default;
};

namespace detail {

// The round a step of `plan` joins: its collective and what must match to fuse it.
constexpr BatchRound round_key(const Plan& plan, const Step& s) {
  BatchRound key;
  const bool native = s.kind == StepKind::all_reduce ||
                      (s.kind != StepKind::exchange && (s.padded || step_is_even(plan, s)));
  if (!native) return key;  // a point-to-point round
  key.kind = s.kind;
  key.mesh_dim = s.mesh_dim;
  if (s.kind == StepKind::reduce_scatter || s.kind == StepKind::all_reduce) {
    key.dtype = plan.src().dtype();
    key.op = s.before[s.mesh_dim].reduce_op();
  }
  return key;
}

constexpr bool same_round(const BatchRound& a, const BatchRound& b) noexcept {
  return a.kind == b.kind && a.mesh_dim == b.mesh_dim && a.dtype == b.dtype && a.op == b.op;
}

// The backend calls a round of `key` makes as the simulated backend counts them: a collective
// one per group of its mesh dim, a point-to-point round one.
constexpr int round_calls(const DeviceMesh& mesh, const BatchRound& key) {
  return key.kind == StepKind::exchange ? 1 : mesh.size() / mesh.size(key.mesh_dim);
}

// What step `s` of `plan` costs the rank at `c` when it runs as point-to-point messages (in a
// batch's exchange round): an exchange as planned; a gather, reduce-scatter or all-to-all with
// exact pieces, one message from each other member of its group whose piece for it is not
// empty; an all-reduce sends its block to every other member and reduces the g blocks itself
// ((g-1) blocks each way, where a ring moves 2(g-1)/g). Messages pay the model's
// point-to-point latency.
constexpr RankStepCost point_to_point_cost(const Plan& plan, const Step& s, const MeshCoord& c,
                                           const CostModel& model) {
  const Layout& base = plan.src();
  if (s.kind == StepKind::exchange) return rank_step_cost(base, s, c, model);
  const int k = s.mesh_dim, g = base.mesh().size(k);
  RankStepCost out;
  if (!moves_data(s.kind) || g == 1) return out;
  if (s.kind == StepKind::all_reduce) {
    const std::int64_t block = bytes_mul(base.local_box(s.before, c).numel(), base.elem_bytes());
    out.bytes.recv = out.bytes.send = bytes_mul(g - 1, block);
    out.exact_messages = block > 0 ? g - 1 : 0;
  } else {
    out = rank_step_cost(base, s.before, s.after, s.kind, k, false, c, model);
  }
  out.us =
      model.dims[k].time_us(model.p2p_latency_factor * out.exact_messages, double(out.bytes.recv));
  return out;
}

// What step `s` of `plan` costs the rank at `c` in a round of kind `round`.
constexpr RankStepCost round_step_cost(const Plan& plan, const Step& s, StepKind round,
                                       const MeshCoord& c, const CostModel& model) {
  if (round == StepKind::exchange) return point_to_point_cost(plan, s, c, model);
  return rank_step_cost(plan.src(), s.before, s.after, s.kind, s.mesh_dim, s.padded, c, model);
}

// Whether the step sends or receives anything (a mesh dim of extent 1 was made an identity).
constexpr bool communicates(const Step& s) noexcept { return moves_data(s.kind); }

// The cost model with no bandwidth term (latency only) or no latency term (bandwidth only).
constexpr CostModel latency_only(CostModel m) noexcept {
  for (LinkCost& l : m.dims) l.bandwidth_gbs = 1e300;
  return m;
}
constexpr CostModel bandwidth_only(CostModel m) noexcept {
  for (LinkCost& l : m.dims) l.latency_us = 0;
  return m;
}

}  // namespace detail

// The plan of a batch of redistributions on one mesh: each tensor's own plan (as
// plan_redistribute gives it), and the rounds that run them together. Every communicating step
// of every tensor belongs to one round; the rounds run in order, and the local steps of each
// tensor run between its rounds. Fixed capacity N tensors, no heap (a BatchPlan<64> is about
// 300 KiB: keep large ones out of small stacks).
template <std::size_t N = default_batch_capacity>
class BatchPlan {
 public:
  // The most rounds a batch can need: one per communicating step of every tensor.
  static constexpr std::size_t max_rounds = N * max_plan_steps;

  [[nodiscard]] constexpr std::size_t size() const noexcept { return plans_.size(); }
  [[nodiscard]] constexpr bool empty() const noexcept { return plans_.empty(); }
  // Tensor t's own plan.
  [[nodiscard]] constexpr const Plan& operator[](std::size_t t) const { return plans_.at(t); }
  [[nodiscard]] constexpr auto begin() const noexcept { return plans_.begin(); }
  [[nodiscard]] constexpr auto end() const noexcept { return plans_.end(); }
  // The rounds, in the order every rank runs them.
  [[nodiscard]] constexpr const detail::static_vector<BatchRound, max_rounds>& rounds()
      const noexcept {
    return rounds_;
  }
  // The round of step `i` of tensor t's plan, or -1 for a local step.
  [[nodiscard]] constexpr int round_of(std::size_t t, std::size_t i) const {
    return round_of_.at(t).at(i);
  }
  // Whether step `i` of tensor t's plan runs as point-to-point messages: it is in a
  // point-to-point round (exact sizes, or a round whose steps differ), not a collective.
  [[nodiscard]] constexpr bool point_to_point(std::size_t t, std::size_t i) const {
    const int r = round_of(t, i);
    return r >= 0 && rounds_[static_cast<std::size_t>(r)].kind == StepKind::exchange;
  }

  // Collectives (and point-to-point rounds) the batch issues, and the tensors one by one.
  [[nodiscard]] constexpr int collectives() const noexcept {
    return static_cast<int>(rounds_.size());
  }
  [[nodiscard]] constexpr int collectives_unbatched() const noexcept {
    int n = 0;
    for (const Plan& p : plans_) n += p.communication_steps();
    return n;
  }
  // The most bytes a rank receives (sends) over the whole batch.
  [[nodiscard]] constexpr std::int64_t bytes_recv_max() const noexcept { return bytes_recv_max_; }
  [[nodiscard]] constexpr std::int64_t bytes_send_max() const noexcept { return bytes_send_max_; }
  // Estimated time of the rounds, and of the tensors' plans one after another.
  [[nodiscard]] constexpr double est_us() const noexcept { return est_us_; }
  [[nodiscard]] constexpr double est_us_unbatched() const noexcept {
    double us = 0;
    for (const Plan& p : plans_) us += p.est_us();
    return us;
  }
  // What batching saves by the cost model: the latency terms of the steps it fuses.
  [[nodiscard]] constexpr double saving_us() const noexcept { return est_us_unbatched() - est_us_; }

  // The backend calls the rounds make, as the simulated backend counts them: a collective one
  // per group of its mesh dim, a point-to-point round one.
  [[nodiscard]] constexpr int backend_calls() const {
    int n = 0;
    for (const BatchRound& r : rounds_) n += detail::round_calls(plans_[0].src().mesh(), r);
    return n;
  }
  // The most backend calls any one tensor's plan makes alone.
  [[nodiscard]] constexpr int backend_calls_alone_max() const {
    int most = 0;
    for (const Plan& p : plans_) {
      int n = 0;
      for (const Step& s : p)
        if (detail::communicates(s))
          n += detail::round_calls(p.src().mesh(), detail::round_key(p, s));
      most = n > most ? n : most;
    }
    return most;
  }

  template <std::size_t M>
  friend constexpr BatchPlan<M> plan_batch(std::span<const Redistribution>, PlanOptions,
                                           BatchSchedule);

 private:
  detail::static_vector<Plan, N> plans_;
  detail::static_vector<std::array<std::int16_t, max_plan_steps>, N> round_of_;
  detail::static_vector<BatchRound, max_rounds> rounds_;
  std::int64_t bytes_recv_max_ = 0;
  std::int64_t bytes_send_max_ = 0;
  double est_us_ = 0;

  constexpr void schedule(BatchSchedule how);
  constexpr void schedule_greedy();
  constexpr void schedule_aligned();
  constexpr void cost();
};

// The bytes global rank `rank` sends and receives in round `r` of the batch: the sum of its
// steps', except that an all-reduce round reduces the packed buffer in one set of pieces.
template <std::size_t N>
constexpr RankBytes round_rank_bytes(const BatchPlan<N>& batch, std::size_t r, int rank) {
  RankBytes total;
  const BatchRound& round = batch.rounds()[r];
  std::int64_t reduced = 0, elem = 0;
  MeshCoord c;
  for (std::size_t t = 0; t < batch.size(); ++t) {
    const Plan& p = batch[t];
    c = p.src().mesh().coordinate(rank);
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (batch.round_of(t, i) != static_cast<int>(r)) continue;
      if (round.kind == StepKind::all_reduce) {
        reduced += p.src().local_box(p[i].before, c).numel();
        elem = p.src().elem_bytes();
        continue;
      }
      const RankBytes b = detail::round_step_cost(p, p[i], round.kind, c, p.cost_model()).bytes;
      total.send = detail::bytes_add(total.send, b.send);
      total.recv = detail::bytes_add(total.recv, b.recv);
    }
  }
  if (round.kind == StepKind::all_reduce && reduced > 0) {
    const int g = batch[0].src().mesh().size(round.mesh_dim);
    const std::int64_t piece =
        chunk_range(reduced, g, c[round.mesh_dim], ChunkPolicy::balanced).size;
    total.recv = total.send = detail::bytes_mul(
        detail::bytes_add(detail::bytes_mul(g - 1, piece), reduced - piece), elem);
  }
  return total;
}

// The bytes global rank `rank` sends and receives over the whole batch.
template <std::size_t N>
constexpr RankBytes batch_rank_bytes(const BatchPlan<N>& batch, int rank) {
  RankBytes total;
  for (std::size_t r = 0; r < batch.rounds().size(); ++r) {
    const RankBytes b = round_rank_bytes(batch, r, rank);
    total.send = detail::bytes_add(total.send, b.send);
    total.recv = detail::bytes_add(total.recv, b.recv);
  }
  return total;
}

// Rounds and costs, as `how` says (BatchSchedule).
template <std::size_t N>
constexpr void BatchPlan<N>::schedule(BatchSchedule how) {
  schedule_greedy();
  if (how == BatchSchedule::fewest_calls && !plans_.empty() &&
      backend_calls() > backend_calls_alone_max()) {
    rounds_.clear();
    round_of_.clear();
    schedule_aligned();
  }
  cost();
}

// Aligned rounds: round r holds the r-th communicating step of every tensor that has one. A
// round whose steps all fuse is their collective; any other is one point-to-point round that
// runs each of its steps as messages (point_to_point_cost). There are as many rounds as the
// longest plan has communicating steps, and each calls the backend no more often than that
// plan's step at the same position: the batch no more often than that plan alone.
template <std::size_t N>
constexpr void BatchPlan<N>::schedule_aligned() {
  const std::size_t n = plans_.size();
  std::array<std::size_t, N> at{};  // each tensor's next step
  for (std::size_t t = 0; t < n; ++t) {
    round_of_.push_back({});
    round_of_[t].fill(-1);
  }
  while (true) {
    BatchRound round;
    bool any = false, same = true;
    for (std::size_t t = 0; t < n; ++t) {
      const Plan& p = plans_[t];
      while (at[t] < p.size() && !detail::communicates(p[at[t]])) ++at[t];
      if (at[t] == p.size()) continue;
      const BatchRound key = detail::round_key(p, p[at[t]]);
      if (!any) round = key;
      same = same && detail::same_round(round, key);
      any = true;
    }
    if (!any) return;
    if (!same) round = BatchRound{};  // a point-to-point round
    const auto index = static_cast<std::int16_t>(rounds_.size());
    for (std::size_t t = 0; t < n; ++t) {
      if (at[t] == plans_[t].size()) continue;
      round_of_[t][at[t]++] = index;
      ++round.tensors;
    }
    rounds_.push_back(round);
  }
}

// Rounds, greedily: the next round is the next step of the tensor with the most communicating
// steps left (ties: the step most tensors wait at), and every tensor waiting at a step of the
// same collective joins it. When every tensor's sequence of collectives is a subsequence of
// the longest one (tensors with the same pair of placements, or a subset of its steps), the
// batch issues exactly as many collectives as that longest plan.
template <std::size_t N>
constexpr void BatchPlan<N>::schedule_greedy() {
  const std::size_t n = plans_.size();
  std::array<std::size_t, N> at{};     // each tensor's next communicating step
  std::array<bool, N> waiting{};       // whether it has one
  std::array<BatchRound, N> head{};    // and the round that step joins
  auto advance = [&](std::size_t t) {  // to the first communicating step from at[t] on
    const Plan& p = plans_[t];
    while (at[t] < p.size() && !detail::communicates(p[at[t]])) ++at[t];
    waiting[t] = at[t] < p.size();
    if (waiting[t]) head[t] = detail::round_key(p, p[at[t]]);
  };
  auto left = [&](std::size_t t) {
    int k = 0;
    for (std::size_t i = at[t]; i < plans_[t].size(); ++i)
      k += detail::communicates(plans_[t][i]) ? 1 : 0;
    return k;
  };
  for (std::size_t t = 0; t < n; ++t) {
    round_of_.push_back({});
    round_of_[t].fill(-1);
    advance(t);
  }
  while (true) {
    std::size_t lead = n;
    int lead_left = 0, lead_joined = 0;
    for (std::size_t t = 0; t < n; ++t) {
      if (!waiting[t]) continue;
      const int l = left(t);
      if (l < lead_left) continue;
      int joined = 0;
      for (std::size_t u = 0; u < n; ++u)
        if (waiting[u] && detail::same_round(head[t], head[u])) ++joined;
      if (l > lead_left || joined > lead_joined) lead = t, lead_left = l, lead_joined = joined;
    }
    if (lead == n) return;
    BatchRound round = head[lead];
    const auto index = static_cast<std::int16_t>(rounds_.size());
    for (std::size_t t = 0; t < n; ++t) {
      if (!waiting[t] || !detail::same_round(round, head[t])) continue;
      round_of_[t][at[t]] = index;
      ++at[t];
      advance(t);
      ++round.tensors;
    }
    rounds_.push_back(round);
  }
}

// Each round's bytes and time (one latency, the largest of its steps', plus every step's
// bandwidth term, on the busiest rank), and the batch's totals.
template <std::size_t N>
constexpr void BatchPlan<N>::cost() {
  bytes_recv_max_ = bytes_send_max_ = 0;
  est_us_ = 0;
  if (plans_.empty()) return;
  const DeviceMesh& mesh = plans_[0].src().mesh();
  for (int i = 0; i < mesh.size(); ++i) {
    const int rank = mesh.rank_at(i);
    const MeshCoord c = mesh.coordinate(rank);
    RankBytes total;
    for (std::size_t r = 0; r < rounds_.size(); ++r) {
      BatchRound& round = rounds_[r];
      const RankBytes b = round_rank_bytes(*this, r, rank);
      round.bytes_recv_max = detail::max_of(round.bytes_recv_max, b.recv);
      round.bytes_send_max = detail::max_of(round.bytes_send_max, b.send);
      total.send = detail::bytes_add(total.send, b.send);
      total.recv = detail::bytes_add(total.recv, b.recv);
      double latency = 0, bandwidth = 0;
      for (std::size_t t = 0; t < plans_.size(); ++t) {
        const Plan& p = plans_[t];
        const CostModel lat = detail::latency_only(p.cost_model());
        const CostModel bw = detail::bandwidth_only(p.cost_model());
        for (std::size_t s = 0; s < p.size(); ++s) {
          if (round_of_[t][s] != static_cast<int>(r)) continue;
          const Step& st = p[s];
          const double l = detail::round_step_cost(p, st, round.kind, c, lat).us;
          latency = l > latency ? l : latency;
          bandwidth += detail::round_step_cost(p, st, round.kind, c, bw).us;
        }
      }
      const double us = latency + bandwidth;
      round.est_us = us > round.est_us ? us : round.est_us;
    }
    bytes_recv_max_ = detail::max_of(bytes_recv_max_, total.recv);
    bytes_send_max_ = detail::max_of(bytes_send_max_, total.send);
  }
  for (const BatchRound& round : rounds_) est_us_ += round.est_us;
}

// The batched plan of `batch` (at most N tensors, all on one mesh; shapes, dtypes and
// placements may differ): each tensor planned by plan_redistribute with `options` (but no
// exchange from a Partial, whose two rounds a batch's one round per step cannot run), then its
// steps grouped into rounds as `schedule` says. Under Memory::automatic every tensor seeks the
// bound where the tensors' largest ends together reach options.bounded_from_bytes (their rounds
// pack them together).
template <std::size_t N = default_batch_capacity>
constexpr BatchPlan<N> plan_batch(std::span<const Redistribution> batch, PlanOptions options = {},
                                  BatchSchedule schedule = BatchSchedule::fused) {
  if (batch.size() > N) detail::fail<detail::why::batch_too_many>(N, batch.size());
  BatchPlan<N> out;
  std::int64_t ends = 0;
  for (std::size_t t = 0; t < batch.size(); ++t) {
    if (!(batch[t].src.mesh() == batch[0].src.mesh()))
      detail::fail<detail::why::batch_mesh_mismatch>(t, batch[t].src.mesh().shape(),
                                                     batch[0].src.mesh().shape());
    detail::check_same_tensor(batch[t].src, batch[t].dst);
    ends = detail::bytes_add(ends, detail::largest_end_bytes(batch[t].src, batch[t].dst));
  }
  const bool seek = options.memory == Memory::automatic && ends >= options.bounded_from_bytes;
  for (const Redistribution& r : batch)
    out.plans_.push_back(detail::plan_redistribute(r.src, r.dst, options, false, seek));
  out.schedule(schedule);
  return out;
}

// plan_redistribute over a list of (source, target) pairs: the batched plan (plan_batch).
template <std::size_t N = default_batch_capacity>
constexpr BatchPlan<N> plan_redistribute(std::span<const Redistribution> batch,
                                         PlanOptions options = {},
                                         BatchSchedule schedule = BatchSchedule::fused) {
  return plan_batch<N>(batch, options, schedule);
}

}  // namespace dtensor
