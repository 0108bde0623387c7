// Compile-time facts about plans: building this file is the test.
#include <dtensor/dtensor.hpp>

namespace {
using namespace dtensor;

constexpr DeviceMesh mesh1({4});
constexpr DeviceMesh mesh2({2, 4});
constexpr Shape shape{1024, 4096};

constexpr Layout on1(const char* placements) {
  return Layout(mesh1, parse_placements(placements), shape, DType::bf16);
}
constexpr Layout on2(const char* placements) {
  return Layout(mesh2, parse_placements(placements), shape, DType::bf16);
}
constexpr std::int64_t total = 1024 * 4096 * 2;

// The four collectives on one mesh dim.
static_assert(plan_redistribute(on1("S(0)"), on1("R"))[0].kind == StepKind::all_gather);
static_assert(plan_redistribute(on1("S(0)"), on1("R")).bytes_recv_max() == total * 3 / 4);
static_assert(plan_redistribute(on1("P"), on1("S(1)"))[0].kind == StepKind::reduce_scatter);
static_assert(plan_redistribute(on1("P"), on1("R"))[0].kind == StepKind::all_reduce);
static_assert(plan_redistribute(on1("S(0)"), on1("S(1)"))[0].kind == StepKind::all_to_all);
static_assert(plan_redistribute(on1("R"), on1("S(0)"))[0].kind == StepKind::chunk);
static_assert(plan_redistribute(on1("R"), on1("R")).size() == 0);

// Seed 004's nested case, collectives only: replicate inner to outer, shard outer to inner.
constexpr PlanOptions collectives{.allow_exchange = false};
static_assert(plan_redistribute(on2("S(0),S(0)"), on2("R,S(0)"), collectives).size() == 3);
static_assert(plan_redistribute(on2("S(0),S(0)"), on2("R,S(0)"), collectives)[0].mesh_dim == 1);
// (S(0), R) -> (R, S(0)) on 2x4: greedy gathers a half block and chunks it. With collectives
// only, the planner fills mesh dim 0 into P(sum), chunks mesh dim 1 and all-reduces a quarter
// block over mesh dim 0, the lower bound (a detour, the block being large); with exchanges, one
// exchange at the lower bound.
static_assert(plan_redistribute(on2("S(0),R"), on2("R,S(0)"), collectives).size() == 3);
static_assert(plan_redistribute(on2("S(0),R"), on2("R,S(0)"), collectives)[2].kind ==
              StepKind::all_reduce);
static_assert(plan_redistribute(on2("S(0),R"), on2("R,S(0)"), collectives).bytes_recv_max() ==
              total / 4);
static_assert(plan_redistribute(on2("S(0),R"), on2("R,S(0)")).size() == 1);
static_assert(plan_redistribute(on2("S(0),R"), on2("R,S(0)")).bytes_recv_max() == total / 4);
static_assert(plan_redistribute(on2("S(0),R"), on2("R,S(0)")).lower_bound_bytes_recv_max() ==
              total / 4);

// Uneven pieces: the padding choice and the one-rank rejection of candidates run at compile
// time too. 7 rows over 2 then 2: the plan moves no less than the bound.
constexpr Layout uneven(const char* placements) {
  return {DeviceMesh({2, 2}), parse_placements(placements), {7, 10}};
}
static_assert(plan_redistribute(uneven("S(0),R"), uneven("R,S(1)")).bytes_recv_max() >=
              plan_redistribute(uneven("S(0),R"), uneven("R,S(1)")).lower_bound_bytes_recv_max());
static_assert(plan_redistribute(uneven("P,S(0)"), uneven("S(1),S(0)")).size() >= 1);

// On more than 8 ranks the planner costs one rank of each kind: an exchange between even layouts
// whose cuts nest (BlockRelation), uneven collectives by their blocks' extents
// (for_each_block_shape). The same figures at compile time.
constexpr Layout on16(const char* placements, Shape s = {64, 64}) {
  return {DeviceMesh({4, 4}), parse_placements(placements), s};
}
static_assert(plan_redistribute(on16("S(0),R"), on16("R,S(0)")).size() == 1);
static_assert(plan_redistribute(on16("S(0),R"), on16("R,S(0)")).bytes_recv_max() ==
              64 * 64 * 4 / 4);
// The figures are the maxima over every rank.
constexpr bool reports_maxima(const Plan& p) {
  std::int64_t recv = 0, send = 0;
  for (int r = 0; r < p.src().mesh().size(); ++r) {
    recv = rank_bytes(p, r).recv > recv ? rank_bytes(p, r).recv : recv;
    send = rank_bytes(p, r).send > send ? rank_bytes(p, r).send : send;
  }
  return recv == p.bytes_recv_max() && send == p.bytes_send_max();
}
static_assert(reports_maxima(plan_redistribute(on16("S(0),R"), on16("R,S(0)"))));
static_assert(reports_maxima(plan_redistribute(on16("S(0),S(1)", {7, 10}),
                                               on16("R,S(1)", {7, 10}))));
static_assert(reports_maxima(plan_redistribute(on16("S(1),S(0)", {7, 10}),
                                               on16("S(0),S(1)", {7, 10}))));

// An exchange into a Partial: the two ranks of each column group of (P(sum), S(1)) hold the
// same rows and split the rows they lack, a quarter of the block each, the bound.
constexpr PlanOptions fewest_bytes{.objective = Objective::bytes};
constexpr Layout square(const char* placements) {
  return {DeviceMesh({2, 2}), parse_placements(placements), {8, 16}};
}
static_assert(plan_redistribute(square("R,S(0)"), square("P(sum),S(1)"), fewest_bytes).size() == 1);
static_assert(plan_redistribute(square("R,S(0)"), square("P(sum),S(1)"), fewest_bytes)
                  .bytes_recv_max() == 64);
static_assert(plan_redistribute(square("R,S(0)"), square("P(sum),S(1)"), fewest_bytes)
                  .lower_bound_bytes_recv_max() == 64);

// An exchange from a Partial: each column group of (P(sum), S(0)) reduces its rows in two
// parts, the larger to the member whose target lies in them; 192 B per rank, where an
// all-to-all and a reduce-scatter receive 256 B.
static_assert(plan_redistribute(square("P(sum),S(0)"), square("S(0),S(1)"), fewest_bytes).size() ==
              1);
static_assert(plan_redistribute(square("P(sum),S(0)"), square("S(0),S(1)"), fewest_bytes)
                  .bytes_recv_max() == 192);

// Cut by elements: 7 rows of 10 reduced and scattered over 4 ranks, the member of one row
// reducing more than a row's share: 228 B per rank, where a reduce-scatter receives 240 B.
constexpr Layout uneven_line(const char* placements) {
  return {DeviceMesh({4}), parse_placements(placements), {7, 10}};
}
static_assert(
    plan_redistribute(uneven_line("P(sum)"), uneven_line("S(0)"), fewest_bytes)[0].by_elements);
static_assert(plan_redistribute(uneven_line("P(sum)"), uneven_line("S(0)"), fewest_bytes)
                  .bytes_recv_max() == 228);
// And by elements in column-major order to column blocks of 3, 3, 3 and 1: 236 B, where a
// reduce-scatter receives 252 B.
static_assert(
    plan_redistribute(uneven_line("P(sum)"), uneven_line("S(1)"), fewest_bytes)[0].by_elements);
static_assert(plan_redistribute(uneven_line("P(sum)"), uneven_line("S(1)"), fewest_bytes)
                  .bytes_recv_max() == 236);

// Adjoint pairs.
static_assert(plan_adjoint(on1("S(0)"), on1("R"))[0].kind == StepKind::reduce_scatter);
static_assert(plan_adjoint(on1("R"), on1("S(0)"))[0].kind == StepKind::fill);
static_assert(plan_adjoint(on1("S(0)"), on1("S(1)"))[0].before == parse_placements("S(1)"));

// The typed front end plans at compile time too.
using Mesh = StaticMesh<2, 4>;
using Big = StaticShape<1024, 4096>;
static_assert(plan_redistribute(static_layout_v<bf16_t, Mesh, Big, Shard<0>, Replicate>,
                                static_layout_v<bf16_t, Mesh, Big, Replicate, Shard<1>>)
                  .bytes_recv_max() ==
              plan_redistribute(on2("S(0),R"), on2("R,S(1)")).bytes_recv_max());
}  // namespace
