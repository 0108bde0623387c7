// Plans whose search takes more constant-evaluation work than compilers allow one constant
// expression by default: they fold with the limits the README gives ("In code"), g++'s
// -fconstexpr-ops-limit=134217728 and clang's -fconstexpr-steps=16777216. Compiling this file
// with them is the test (tests/CMakeLists.txt).
#include <dtensor/dtensor.hpp>

namespace {
using namespace dtensor;

// bench_plan's last row: three steps on 1,024 ranks, uneven, through Partials of two ops.
constexpr Layout row17_from(parse_mesh("32x32"), parse_placements("S(1),P"),
                            parse_shape("1024x100"), DType::bf16);
constexpr Layout row17_to(parse_mesh("32x32"), parse_placements("S(0),P(max)"),
                          parse_shape("1024x100"), DType::bf16);
constexpr Plan row17 = plan_redistribute(row17_from, row17_to);
static_assert(row17.size() == 3);

// The exhaustive matrix's longest search (2x2x2, uneven): three max reductions.
constexpr Layout maxes(parse_mesh("2x2x2"), parse_placements("P(max),P(max),P(max)"),
                       parse_shape("7x10"), DType::f32);
constexpr Layout replicas(parse_mesh("2x2x2"), parse_placements("R,R,R"), parse_shape("7x10"),
                          DType::f32);
constexpr Plan reduced = plan_redistribute(maxes, replicas);
static_assert(reduced.bytes_recv_max() >= reduced.lower_bound_bytes_recv_max());
static_assert(reduced.dst() == replicas);

}  // namespace
