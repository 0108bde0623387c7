// Compile-time facts: building this file is the test.
#include <dtensor/dtensor.hpp>

namespace {
using namespace dtensor;

constexpr DeviceMesh mesh({2, 4}, {"dp", "tp"});
static_assert(mesh.size() == 8);
static_assert(mesh.dim("tp") == 1);
static_assert(mesh.coordinate(6) == MeshCoord{1, 2});
static_assert(mesh.group(6, 1).rank(0) == 4);
static_assert(mesh.submesh({"dp"}, 6).rank_at(0) == 2);

constexpr Layout rows(mesh, {Shard(0), Replicate()}, {1024, 4096}, DType::bf16);
static_assert(rows.local_shape(5) == Shape{512, 4096});
static_assert(rows.global_offset(5) == Shape{512, 0});
static_assert(rows.local_bytes(0) == 512 * 4096 * 2);

// torch.chunk: 5 rows over 4 ranks are 2, 2, 1, 0.
constexpr Layout uneven(DeviceMesh({4}), {Shard(0)}, {5});
static_assert(uneven.local_shape(0)[0] == 2 && uneven.local_shape(2)[0] == 1);
static_assert(uneven.local_shape(3)[0] == 0 && uneven.global_offset(3)[0] == 5);

// Nested: (S(0), S(0)) on 2x4 cuts 16 rows into 8 pieces of 2, outer dim first.
constexpr Layout nested(mesh, {Shard(0), Shard(0)}, {16});
static_assert(nested.global_offset(5)[0] == 10);
// An empty block's offset is PyTorch's: the extent (10 rows, halves of 5, pieces 2, 2, 1, 0).
constexpr Layout nested_uneven(mesh, {Shard(0), Shard(0)}, {10});
static_assert(nested_uneven.local_box(3).offset[0] == 5 && nested_uneven.global_offset(3)[0] == 10);

// The typed front end folds to the same values.
using Mesh24 = StaticMesh<2, 4>;
static_assert(Mesh24::size == 8 && Mesh24::ndim == 2);
static_assert(placements_v<Shard<0>, Replicate> == Placements{Shard(0), Replicate()});
static_assert(placements_v<Partial<ReduceOp::max>>[0].is_partial(ReduceOp::max));
static_assert(static_layout_v<bf16_t, Mesh24, StaticShape<1024, 4096>, Shard<0>, Replicate> ==
              Layout(DeviceMesh({2, 4}), {Shard(0), Replicate()}, {1024, 4096}, DType::bf16));
static_assert(StaticLayout<float, StaticMesh<4>, StaticShape<5, 3>, Shard<-2>>::value.local_shape(
                  3) == Shape{0, 3});
static_assert(StaticPlacement<Shard<1>> && StaticPlacement<Replicate> &&
              !StaticPlacement<Shard<>> && !StaticPlacement<Placement>);

// Parsing and predicates are constexpr too.
static_assert(parse_placements("S(0),P(max)")[1] == Placement(Partial(ReduceOp::max)));
static_assert(has_partial(parse_placements("R,P")));
static_assert(size_of(DType::bf16) == 2 && dtype_of<double> == DType::f64);
}  // namespace
