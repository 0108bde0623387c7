// Compile-time facts about rank relabelling: building this file is the test.
#include <dtensor/dtensor.hpp>

namespace {
using namespace dtensor;

constexpr Shape shape{8, 8};
constexpr Layout rows_then_cols(DeviceMesh({2, 4}), parse_placements("S(0),S(1)"), shape);
constexpr Layout cols_then_rows(DeviceMesh({4, 2}), parse_placements("S(1),S(0)"), shape);

// The same blocks on a transposed mesh: renaming ranks moves nothing.
constexpr Relabelling transposed = find_relabelling(rows_then_cols, cols_then_rows);
static_assert(transposed.method() == RelabelMethod::exact);
static_assert(transposed.moves_nothing() && !transposed.is_identity());
static_assert(transposed.rank_for(1) == 4 && transposed.rank_for(7) == 7);
static_assert(transposed.bytes_recv_max_before() == 8 * 4);
static_assert(find_relabelling(rows_then_cols, cols_then_rows, RelabelMethod::greedy) ==
              find_relabelling(rows_then_cols, cols_then_rows, RelabelMethod::greedy));
static_assert(
    find_relabelling(rows_then_cols, cols_then_rows, RelabelMethod::greedy).moves_nothing());

// Already in place: the identity.
static_assert(find_relabelling(rows_then_cols, rows_then_cols).is_identity());

// On one mesh the bytes before relabelling are the planner's lower bound.
constexpr Layout swapped(DeviceMesh({2, 4}), parse_placements("S(1),S(0)"), shape);
static_assert(find_relabelling(rows_then_cols, swapped).bytes_recv_max_before() ==
              lower_bound_bytes_recv_max(rows_then_cols, swapped));

}  // namespace
