#pragma once

#include <cstdint>
#include <string_view>

#include "config.hpp"
#include "cost_model.hpp"
#include "detail/static_vector.hpp"
#include "layout.hpp"
#include "placement.hpp"

namespace dtensor {

namespace detail {
struct plan_builder;
}

// What one step of a plan does.
enum class StepKind : std::uint8_t {
  identity,        // nothing: the layouts are equal
  all_gather,      // S(i) -> R on one mesh dim
  reduce_scatter,  // P(op) -> S(j) on one mesh dim
  all_reduce,      // P(op) -> R on one mesh dim
  all_to_all,      // S(i) -> S(j) on one mesh dim
  chunk,           // R -> S(j) on one mesh dim: keep this rank's piece, no traffic
  scale,           // R -> P(op) on one mesh dim: no traffic (see PartialFromReplicate)
  fill,            // S(i) -> P(op) on one mesh dim: the shard in a block of op's identity
  exchange,        // any -> any without Partial (but one kept as it is), or from no Partial into
                   // Partials of one op: grouped point-to-point of the missing blocks; or from
                   // Partials of one op into none (but one kept as it is): each group reduces
                   // parts, then delivers them
};

// The step's spelling in explanations and JSON: "all_gather", ...
constexpr std::string_view name(StepKind k) noexcept {
  switch (k) {
    case StepKind::identity: return "identity";
    case StepKind::all_gather: return "all_gather";
    case StepKind::reduce_scatter: return "reduce_scatter";
    case StepKind::all_reduce: return "all_reduce";
    case StepKind::all_to_all: return "all_to_all";
    case StepKind::chunk: return "chunk";
    case StepKind::scale: return "scale";
    case StepKind::fill: return "fill";
    case StepKind::exchange: return "exchange";
  }
  return "?";
}

// Whether the step sends or receives bytes.
constexpr bool moves_data(StepKind k) noexcept {
  return k == StepKind::all_gather || k == StepKind::reduce_scatter || k == StepKind::all_reduce ||
         k == StepKind::all_to_all || k == StepKind::exchange;
}

// What the planner minimises.
enum class Objective : std::uint8_t {
  time,   // the cost model's estimated time
  bytes,  // bytes_recv_max first, then time; uneven steps exact rather than padded
};

// How uneven pieces move in all-gather, reduce-scatter and all-to-all steps.
enum class Padding : std::uint8_t {
  automatic,  // padded when the cost model finds it cheaper (never under Objective::bytes or
              // Memory::bounded)
  always,     // padded to the largest piece: one native collective, padding counted in bytes
  never,      // exact sizes: variable-size rounds of point-to-point messages
};

// How Replicate becomes Partial(sum) (other ops need nothing: avg, max and min keep the
// value; product keeps it on one rank and puts 1 elsewhere).
enum class PartialFromReplicate : std::uint8_t {
  divide,    // every rank holds value / g, as PyTorch does (integer dtypes use keep_one)
  keep_one,  // the rank at coordinate 0 keeps the value, the others hold 0
};

// What a plan may hold between its steps (local steps in a row count as one: an executor runs
// them as one pass).
enum class Memory : std::uint8_t {
  any,        // whatever the cheapest plan holds
  bounded,    // on every rank, no block between steps larger than the larger of its source and
              // target blocks, wherever some candidate plan allows it; uneven pieces move at
              // their exact sizes (Padding::automatic pads nothing), and no group's block is cut
              // by elements; the executor runs a collective whose staging would not fit beside
              // them in bands of rows, and some reductions in rounds (docs/execution.md)
  automatic,  // where a rank's source or target block reaches PlanOptions::bounded_from_bytes
              // (there scratch matters), the fastest plan if it holds the bound as it is, else
              // the bounded plan if it takes at most PlanOptions::memory_slack more time (under
              // Objective::bytes: moves no more bytes), else the fastest; below, any (there
              // latency rules, and the bound can double the time)
};

// Choices for plan_redistribute.
struct PlanOptions {
  Objective objective = Objective::time;
  Padding padding = Padding::automatic;
  bool allow_exchange = true;
  bool allow_all_to_all = true;
  PartialFromReplicate partial_from_replicate = PartialFromReplicate::divide;
  Memory memory = Memory::automatic;
  // Under Memory::automatic: the block size (the larger of the source and target blocks of the
  // rank holding the largest) from which the bound is sought, 1 MiB; and how much more time than
  // the fastest plan a bounded plan may take, as a fraction of the fastest's.
  std::int64_t bounded_from_bytes = std::int64_t{1} << 20;
  double memory_slack = 0.1;
  // Between layouts without Partial, only steps that move values: no pass through P(sum) (a
  // fill and a reduce-scatter, whose sums with zeros turn a -0.0 into +0.0), so every value
  // arrives bit for bit, at times in a slower plan (docs/planner.md, candidate 8).
  bool exact_values = false;
  // The cost model; CostModel::defaults(mesh) when unset.
  bool has_cost_model = false;
  CostModel cost_model{};

  // These options with an explicit cost model.
  [[nodiscard]] constexpr PlanOptions with_cost_model(const CostModel& m) const noexcept {
    PlanOptions o = *this;
    o.has_cost_model = true;
    o.cost_model = m;
    return o;
  }
  friend constexpr bool operator==(const PlanOptions&, const PlanOptions&) noexcept = default;
};

// Bytes one rank sends and receives.
struct RankBytes {
  std::int64_t send = 0;
  std::int64_t recv = 0;
  friend constexpr bool operator==(const RankBytes&, const RankBytes&) noexcept = default;
};

// One step: its kind, the mesh dim whose groups run it (-1 for an exchange, which spans the
// mesh), the placements before and after it, and what it costs.
struct Step {
  StepKind kind = StepKind::identity;
  int mesh_dim = -1;
  Placements before;
  Placements after;
  // Uneven pieces are padded to the largest piece of the group.
  bool padded = false;
  // An exchange from a Partial: each group's block is split among its members as runs of its
  // elements (a part may end mid-row), in row-major order or with another tensor dim outermost
  // (a part may end mid-column), not along one tensor dim.
  bool by_elements = false;
  std::int64_t bytes_send_max = 0;
  std::int64_t bytes_recv_max = 0;
  double est_us = 0;

  // The placement this step changes, before and after (exchange: mesh dim 0's).
  [[nodiscard]] constexpr Placement from() const { return before.at(mesh_dim < 0 ? 0 : mesh_dim); }
  [[nodiscard]] constexpr Placement to() const { return after.at(mesh_dim < 0 ? 0 : mesh_dim); }
  friend constexpr bool operator==(const Step&, const Step&) noexcept = default;
};

// The most steps a plan holds: at most three per mesh dim, plus one exchange.
inline constexpr std::size_t max_plan_steps = 3 * max_mesh_dims + 1;

// The ordered steps that turn `src` into `dst`, with what they cost. Fixed capacity, no heap.
class Plan {
 public:
  using Steps = detail::static_vector<Step, max_plan_steps>;

  // The empty plan of a default Layout: what arrays of plans start as.
  constexpr Plan() = default;
  // NOLINTNEXTLINE(modernize-pass-by-value): a Layout's move is its copy
  constexpr Plan(const Layout& src, const Layout& dst) : src_(src), dst_(dst) {}

  [[nodiscard]] constexpr const Layout& src() const noexcept { return src_; }
  [[nodiscard]] constexpr const Layout& dst() const noexcept { return dst_; }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return steps_.size(); }
  [[nodiscard]] constexpr bool empty() const noexcept { return steps_.empty(); }
  [[nodiscard]] constexpr const Step& operator[](std::size_t i) const { return steps_.at(i); }
  [[nodiscard]] constexpr auto begin() const noexcept { return steps_.begin(); }
  [[nodiscard]] constexpr auto end() const noexcept { return steps_.end(); }
  [[nodiscard]] constexpr const Steps& steps() const noexcept { return steps_; }

  // The layout before step i (i == size(): the target).
  [[nodiscard]] constexpr Layout layout_before(std::size_t i) const {
    return i == steps_.size() ? dst_ : src_.with_placements(steps_.at(i).before);
  }
  // The layout after step i.
  [[nodiscard]] constexpr Layout layout_after(std::size_t i) const {
    return src_.with_placements(steps_.at(i).after);
  }

  // The largest number of bytes any rank receives (sends) over the whole plan.
  [[nodiscard]] constexpr std::int64_t bytes_recv_max() const noexcept { return bytes_recv_max_; }
  [[nodiscard]] constexpr std::int64_t bytes_send_max() const noexcept { return bytes_send_max_; }
  // The bytes the busiest rank must receive whatever the plan (see lower_bound_bytes).
  [[nodiscard]] constexpr std::int64_t lower_bound_bytes_recv_max() const noexcept {
    return lower_bound_;
  }
  // The cost model's time for the plan: the sum of its steps'.
  [[nodiscard]] constexpr double est_us() const noexcept { return est_us_; }
  // How many steps move data (collectives and exchanges).
  [[nodiscard]] constexpr int communication_steps() const noexcept {
    int n = 0;
    for (const Step& s : steps_) n += moves_data(s.kind) ? 1 : 0;
    return n;
  }
  [[nodiscard]] constexpr const PlanOptions& options() const noexcept { return options_; }
  // Whether the plan was planned, and runs, under the memory bound: Memory::bounded, or
  // Memory::automatic where it chose a plan within the bound.
  [[nodiscard]] constexpr bool memory_bounded() const noexcept { return bounded_; }
  [[nodiscard]] constexpr const CostModel& cost_model() const noexcept {
    return options_.cost_model;
  }

  friend constexpr bool operator==(const Plan&, const Plan&) noexcept = default;

 private:
  friend struct detail::plan_builder;

  Layout src_;
  Layout dst_;
  Steps steps_;
  PlanOptions options_{};
  std::int64_t bytes_recv_max_ = 0;
  std::int64_t bytes_send_max_ = 0;
  std::int64_t lower_bound_ = 0;
  double est_us_ = 0;
  bool pruned_ = false;   // a candidate the planner stopped costing; never returned
  bool fits_ = true;      // under Memory::bounded: its blocks between steps are within the bound
  bool even_ = false;     // every layout it passes through is even (set where it is costed)
  bool bounded_ = false;  // runs within the memory bound (memory_bounded): bounded or automatic
};

}  // namespace dtensor
