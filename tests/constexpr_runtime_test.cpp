// What a translation unit computes at compile time equals what the same calls compute at run
// time in that unit. Frameworks static_assert on plans and plan at run time in one file; g++ 12
// miscompiled the run-time half there: after CostModel::defaults had been evaluated at compile
// time, run-time cost models came out with bandwidth 0 on the mesh dims past the mesh's
// (`dims{}` value-initialized an array of a type with default member initializers), and plans
// differed from the compile-time ones in their options. Every value below is computed both
// ways and compared whole (operator==).
#include <dtensor/dtensor.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <string_view>

namespace {

using namespace dtensor;

// One plan to compute: a redistribution in the CLI's spellings, the options (0: defaults, 1: the
// bytes objective, 2: the memory bound, 3: a cost model set by hand) and which plan (forward,
// gradient or adjoint).
enum class Which { forward, backward, adjoint };
struct Check {
  std::string_view mesh, from, to, shape;
  int options = 0;
  Which which = Which::forward;
};

// Rows of bench_plan (bench/plan_bench.cpp): 1 to 4 mesh dims, up to 1,024 ranks, even and
// uneven, with Partials, collectives and exchanges; and small uneven cases that reach the
// exchanges from and into Partials. A plan of many candidates on 1,024 ranks takes g++ seconds
// to fold, and bench_plan's last row (32x32) more constant-evaluation steps than compilers allow
// by default (README, "In code"): few are folded here, to keep this file's build short.
constexpr Check checks[] = {
    {"8", "S(0)", "R", "1000x4095"},
    {"8", "P", "S(0)", "1024x4096"},
    {"2x4", "S(0),R", "R,S(0)", "1024x4096"},
    {"2x4", "P,S(1)", "R,S(0)", "1024x4096"},
    {"2x4", "S(0),S(0)", "R,S(0)", "1000x4095"},
    {"2x2x2", "S(0),S(1),R", "R,S(0),S(1)", "1024x4096"},
    {"2x2x2x2", "P,S(0),S(1),R", "R,S(1),S(0),S(0)", "1024x4096"},
    {"16x64", "S(0),R", "R,S(0)", "8190x8192"},
    {"2x4", "S(1),P(max)", "P(sum),S(1)", "7x10"},
    {"2x2x2", "P(sum),S(0),S(1)", "R,S(1),P(max)", "7x10"},
    {"2x4", "P,S(0)", "R,S(1)", "7x10", 1},
    {"2x2x2", "S(0),S(1),R", "R,S(0),S(1)", "7x10", 1},
    {"2x4", "P,S(1)", "R,S(0)", "4096x8192", 2},
    {"2x4", "S(0),S(0)", "S(1),S(1)", "4093x8190", 2},
    {"2x4", "S(0),R", "R,S(0)", "1024x4096", 3},
    {"2x2x2", "P,S(0),R", "R,R,S(0)", "7x10", 3},
    {"2x4", "P,S(1)", "R,S(0)", "7x10", 0, Which::backward},
    {"2x2x2", "S(0),S(1),P", "R,S(0),S(1)", "7x10", 0, Which::backward},
    {"2x4", "P,S(1)", "R,S(0)", "7x10", 0, Which::adjoint},
    {"2x2x2", "S(0),S(1),R", "R,P,S(1)", "7x10", 0, Which::adjoint},
};
constexpr std::size_t num_checks = std::size(checks);

// A cost model set by hand on two dims of eight: the others keep LinkCost{}.
constexpr CostModel two_links() {
  CostModel m;
  m.dims[0] = network_like;
  m.dims[1] = LinkCost{1.0, 100.0};
  return m;
}

constexpr PlanOptions options_of(int which) {
  PlanOptions o;
  if (which == 1) o.objective = Objective::bytes;
  if (which == 2) o.memory = Memory::bounded;
  if (which == 3) o = o.with_cost_model(two_links());
  return o;
}

constexpr Plan plan_of(const Check& c) {
  const Layout src(parse_mesh(c.mesh), parse_placements(c.from), parse_shape(c.shape), DType::bf16);
  const Layout dst(parse_mesh(c.mesh), parse_placements(c.to), parse_shape(c.shape), DType::bf16);
  const PlanOptions o = options_of(c.options);
  switch (c.which) {
    case Which::forward: return plan_redistribute(src, dst, o);
    case Which::backward: return plan_backward(src, dst, o);
    case Which::adjoint: return plan_adjoint(src, dst, o);
  }
  return {};
}

// Each plan folded on its own: compilers limit the steps of one constant expression.
template <std::size_t I>
constexpr Plan folded = plan_of(checks[I]);

template <std::size_t... I>
void check_plans(std::index_sequence<I...> /*checks*/) {
  const Plan* at_compile_time[] = {&folded<I>...};
  for (std::size_t i = 0; i < num_checks; ++i) {
    // Through a volatile index: the optimizer does not fold the run-time call either.
    volatile std::size_t index = i;
    const Check& c = checks[index];
    const Plan at_run_time = plan_of(c);
    INFO("check " << i << ": " << c.mesh << " " << c.from << " -> " << c.to << " " << c.shape
                  << ", options " << c.options << ", plan " << static_cast<int>(c.which));
    CHECK(at_run_time == *at_compile_time[i]);
    CHECK(at_run_time.cost_model() ==
          (c.options == 3 ? two_links() : CostModel::defaults(parse_mesh(c.mesh))));
  }
}

constexpr CostModel defaults_2x2x2 = CostModel::defaults(DeviceMesh({2, 2, 2}));

}  // namespace

TEST_CASE("cost models are the same at compile time and at run time") {
  volatile int extent = 2;
  const CostModel at_run_time = CostModel::defaults(DeviceMesh({extent, extent, extent}));
  CHECK(at_run_time == defaults_2x2x2);
  for (std::size_t k = 3; k < max_mesh_dims; ++k) {
    INFO("mesh dim " << k);
    CHECK(at_run_time.dims[k] == LinkCost{});
    CHECK(at_run_time.dims[k].bandwidth_gbs == 1.0);
  }
  const CostModel set_by_hand = two_links();
  CHECK(set_by_hand.dims[7] == LinkCost{});
  constexpr CostModel folded_by_hand = two_links();
  CHECK(set_by_hand == folded_by_hand);
}

TEST_CASE("plans are the same at compile time and at run time") {
  check_plans(std::make_index_sequence<num_checks>{});
}

namespace {

constexpr DeviceMesh batch_mesh({2, 4});
constexpr Redistribution batch_pairs[] = {
    {Layout(batch_mesh, {Shard(0), Shard(0)}, {64, 32}, DType::bf16),
     Layout(batch_mesh, {Replicate(), Replicate()}, {64, 32}, DType::bf16)},
    {Layout(batch_mesh, {Partial(), Shard(1)}, {7, 10}, DType::f32),
     Layout(batch_mesh, {Shard(0), Replicate()}, {7, 10}, DType::f32)},
    {Layout(batch_mesh, {Shard(1), Replicate()}, {128, 3}, DType::i64),
     Layout(batch_mesh, {Replicate(), Shard(0)}, {128, 3}, DType::i64)},
};
constexpr BatchPlan<3> folded_batch = plan_batch<3>(batch_pairs);

constexpr Layout rows_then_cols(DeviceMesh({2, 4}), parse_placements("S(0),S(1)"), {8, 8});
constexpr Layout cols_then_rows(DeviceMesh({4, 2}), parse_placements("S(1),S(0)"), {8, 8});
constexpr Relabelling folded_exact = find_relabelling(rows_then_cols, cols_then_rows);
constexpr Relabelling folded_greedy =
    find_relabelling(rows_then_cols, cols_then_rows, RelabelMethod::greedy);

}  // namespace

TEST_CASE("batches and relabellings are the same at compile time and at run time") {
  volatile std::size_t count = std::size(batch_pairs);
  const BatchPlan<3> batch = plan_batch<3>(std::span(batch_pairs, count));
  CHECK(batch.size() == folded_batch.size());
  CHECK(batch.rounds() == folded_batch.rounds());
  CHECK(batch.collectives() == folded_batch.collectives());
  CHECK(batch.saving_us() == folded_batch.saving_us());
  CHECK(batch.bytes_recv_max() == folded_batch.bytes_recv_max());
  CHECK(batch.est_us() == folded_batch.est_us());
  for (std::size_t t = 0; t < count; ++t) {
    CHECK(batch[t] == folded_batch[t]);
    for (std::size_t i = 0; i < batch[t].size(); ++i)
      CHECK(batch.round_of(t, i) == folded_batch.round_of(t, i));
  }

  volatile auto method = RelabelMethod::automatic;
  CHECK(find_relabelling(rows_then_cols, cols_then_rows, method) == folded_exact);
  CHECK(find_relabelling(rows_then_cols, cols_then_rows, RelabelMethod::greedy) == folded_greedy);
}
