#include <catch2/catch.hpp>

#include <dtensor/layout.hpp>

#include <vector>

using namespace dtensor;

TEST_CASE("torch.chunk and balanced chunking", "[layout]") {
  // torch.chunk: ceil-sized pieces, trailing ones short or empty.
  CHECK(chunk_range(5, 4, 0, ChunkPolicy::torch_chunk) == Range{0, 2});
  CHECK(chunk_range(5, 4, 1, ChunkPolicy::torch_chunk) == Range{2, 2});
  CHECK(chunk_range(5, 4, 2, ChunkPolicy::torch_chunk) == Range{4, 1});
  CHECK(chunk_range(5, 4, 3, ChunkPolicy::torch_chunk) == Range{5, 0});
  CHECK(chunk_range(2, 4, 3, ChunkPolicy::torch_chunk) == Range{2, 0});
  CHECK(chunk_range(0, 4, 0, ChunkPolicy::torch_chunk) == Range{0, 0});
  // balanced: sizes differ by at most one.
  CHECK(chunk_range(5, 4, 0, ChunkPolicy::balanced) == Range{0, 2});
  CHECK(chunk_range(5, 4, 1, ChunkPolicy::balanced) == Range{2, 1});
  CHECK(chunk_range(5, 4, 3, ChunkPolicy::balanced) == Range{4, 1});
  CHECK(max_chunk(5, 4, ChunkPolicy::torch_chunk) == 2);
  CHECK(max_chunk(3, 4, ChunkPolicy::balanced) == 1);
}

TEST_CASE("chunks tile the dim in order, for every n and k", "[layout]") {
  for (ChunkPolicy policy : {ChunkPolicy::torch_chunk, ChunkPolicy::balanced}) {
    for (std::int64_t n = 0; n <= 20; ++n) {
      for (int k = 1; k <= 9; ++k) {
        std::int64_t next = 0, largest = 0, smallest = n;
        for (int j = 0; j < k; ++j) {
          const Range r = chunk_range(n, k, j, policy);
          CHECK(r.start == next);
          CHECK(r.size >= 0);
          next = r.start + r.size;
          largest = std::max(largest, r.size);
          smallest = std::min(smallest, r.size);
        }
        CHECK(next == n);
        CHECK(largest == max_chunk(n, k, policy));
        if (policy == ChunkPolicy::balanced) CHECK(largest - smallest <= 1);
        if (policy == ChunkPolicy::torch_chunk) CHECK(largest == (n + k - 1) / k);
      }
    }
  }
}

TEST_CASE("local shapes and offsets on a 2x4 mesh", "[layout]") {
  const DeviceMesh m({2, 4});
  const Layout l(m, {Shard(0), Shard(1)}, {1024, 4096}, DType::bf16);
  CHECK(l.local_shape(5) == Shape{512, 1024});
  CHECK(l.global_offset(5) == Shape{512, 1024});
  CHECK(l.local_bytes(5) == 512 * 1024 * 2);
  CHECK(l.global_bytes() == 1024 * 4096 * 2);
  CHECK(l.max_local_bytes() == 512 * 1024 * 2);

  const Layout r(m, {Replicate(), Partial()}, {1024, 4096});
  CHECK(r.local_shape(7) == Shape{1024, 4096});
  CHECK(r.global_offset(7) == Shape{0, 0});
}

TEST_CASE("uneven and empty shards follow torch.chunk", "[layout]") {
  const Layout l(DeviceMesh({4}), {Shard(0)}, {5, 3});
  CHECK(l.local_shape(0) == Shape{2, 3});
  CHECK(l.local_shape(2) == Shape{1, 3});
  CHECK(l.local_shape(3) == Shape{0, 3});
  CHECK(l.global_offset(3) == Shape{5, 0});
  CHECK(l.local_numel(3) == 0);
  CHECK(l.local_box(3).empty());

  const Layout b(DeviceMesh({4}), {Shard(0)}, {5, 3}, DType::f32, ChunkPolicy::balanced);
  CHECK(b.local_shape(0) == Shape{2, 3});
  CHECK(b.local_shape(3) == Shape{1, 3});
  CHECK(b.global_offset(3) == Shape{4, 0});
}

TEST_CASE("nested sharding of one tensor dim goes outermost mesh dim first", "[layout]") {
  // (Shard(0), Shard(0)) on 2x4: mesh dim 0 halves the rows, mesh dim 1 quarters each half.
  const Layout l(DeviceMesh({2, 4}), {Shard(0), Shard(0)}, {16, 2});
  for (int r = 0; r < 8; ++r) {
    CHECK(l.local_shape(r) == Shape{2, 2});
    CHECK(l.global_offset(r) == Shape{2 * r, 0});
  }
  // Uneven: 10 rows -> halves of 5 -> pieces 2, 2, 1, 0.
  const Layout u(DeviceMesh({2, 4}), {Shard(0), Shard(0)}, {10});
  const std::int64_t sizes[] = {2, 2, 1, 0, 2, 2, 1, 0};
  const std::int64_t offsets[] = {0, 2, 4, 5, 5, 7, 9, 10};
  for (int r = 0; r < 8; ++r) {
    CHECK(u.local_shape(r) == Shape{sizes[r]});
    CHECK(u.local_box(r) == Box{Shape{offsets[r]}, Shape{sizes[r]}});
  }
  // An empty block's global offset is PyTorch's (compute_local_shape_and_global_offset): the
  // global extent along its empty dims, wherever its piece starts in the nesting.
  CHECK(u.global_offset(3) == Shape{10});
  CHECK(u.global_offset(7) == Shape{10});
  CHECK(u.global_offset(2) == Shape{4});
  const Layout cols(DeviceMesh({2, 4}), {Shard(1), Shard(1)}, {7, 10});
  CHECK(cols.local_box(3) == Box{{0, 5}, {7, 0}});
  CHECK(cols.global_offset(3) == Shape{0, 10});
  CHECK(cols.global_offset(2) == Shape{0, 4});
  // 3-D mesh, two dims nesting on tensor dim 1 and one on dim 0.
  const Layout t(DeviceMesh({2, 2, 2}), {Shard(1), Shard(0), Shard(1)}, {4, 8});
  CHECK(t.local_box(MeshCoord{1, 0, 1}) == Box{{0, 6}, {2, 2}});
  CHECK(t.local_box(MeshCoord{0, 1, 1}) == Box{{2, 2}, {2, 2}});
}

TEST_CASE("negative shard dims count from the end", "[layout]") {
  const Layout l(DeviceMesh({2}), {Shard(-1)}, {4, 6});
  CHECK(l.placement(0) == Placement(Shard(1)));
  CHECK(l.local_shape(1) == Shape{4, 3});
  CHECK(l == Layout(DeviceMesh({2}), {Shard(1)}, {4, 6}));
}

namespace {
// How many ranks hold each element of the global tensor.
std::vector<int> coverage(const Layout& l) {
  const Shape& g = l.global_shape();
  std::vector<int> count(static_cast<std::size_t>(l.global_numel()), 0);
  for (int r = 0; r < l.mesh().size(); ++r) {
    const Box b = l.local_box(r);
    for (std::size_t d = 0; d < g.size(); ++d) {
      REQUIRE(b.offset[d] >= 0);
      REQUIRE(b.offset[d] + b.shape[d] <= g[d]);
    }
    if (b.empty()) continue;
    // Walk the box (at most 3 dims here).
    for (std::int64_t i = 0; i < b.shape[0]; ++i)
      for (std::int64_t j = 0; j < (g.size() > 1 ? b.shape[1] : 1); ++j)
        for (std::int64_t k = 0; k < (g.size() > 2 ? b.shape[2] : 1); ++k) {
          std::int64_t idx = b.offset[0] + i;
          if (g.size() > 1) idx = idx * g[1] + b.offset[1] + j;
          if (g.size() > 2) idx = idx * g[2] + b.offset[2] + k;
          ++count[static_cast<std::size_t>(idx)];
        }
  }
  return count;
}
}  // namespace

TEST_CASE("every layout covers the tensor once per replica, exhaustively", "[layout]") {
  const Placement options[] = {Replicate(), Partial(), Shard(0), Shard(1), Shard(2)};
  const DeviceMesh meshes[] = {DeviceMesh({4}), DeviceMesh({2, 2}), DeviceMesh({2, 4}),
                               DeviceMesh({3, 2}), DeviceMesh({2, 2, 2})};
  const Shape shapes[] = {{8, 4, 2}, {5, 3, 7}, {1, 2, 3}, {0, 4, 4}};
  int checked = 0;
  for (const DeviceMesh& m : meshes) {
    const int n = m.ndim();
    int combos = 1;
    for (int i = 0; i < n; ++i) combos *= 5;
    for (int c = 0; c < combos; ++c) {
      Placements ps;
      int replicas = 1;
      for (int i = 0, rest = c; i < n; ++i, rest /= 5) {
        ps.push_back(options[rest % 5]);
        if (!options[rest % 5].is_shard()) replicas *= m.size(i);
      }
      for (const Shape& s : shapes) {
        for (ChunkPolicy policy : {ChunkPolicy::torch_chunk, ChunkPolicy::balanced}) {
          const Layout l(m, ps, s, DType::f32, policy);
          for (int v : coverage(l)) REQUIRE(v == replicas);
          ++checked;
        }
      }
    }
  }
  CHECK(checked > 1000);
}

TEST_CASE("intersecting boxes", "[layout]") {
  const Box a{{0, 0}, {4, 4}}, b{{2, 3}, {4, 4}};
  CHECK(intersect(a, b) == Box{{2, 3}, {2, 1}});
  CHECK(intersect(a, Box{{4, 0}, {1, 1}}).empty());
}

TEST_CASE("bad layouts are refused with the offending value", "[layout][errors]") {
  const DeviceMesh m({2, 4});
  CHECK_THROWS_WITH(Layout(m, {Shard(0)}, {4, 4}),
                    "1 placements for a mesh of 2 dims: one per mesh dim");
  CHECK_THROWS_WITH(Layout(m, {Shard(2), Replicate()}, {4, 4}),
                    "Shard(2) is out of range for a tensor of 2 dims");
  CHECK_THROWS_WITH(Layout(m, {Shard(-3), Replicate()}, {4, 4}),
                    "Shard(-3) is out of range for a tensor of 2 dims");
  CHECK_THROWS_WITH(Layout(m, {Shard(0), Replicate()}, {}),
                    "Shard(0) is out of range for a tensor of 0 dims");
  CHECK_THROWS_WITH(Layout(m, {Replicate(), Replicate()}, {4, -1}),
                    "tensor dim 1 has negative size -1");
  CHECK_THROWS_WITH(Layout(m, {Replicate(), Replicate()}, {INT64_MAX / 2, 4}),
                    "the tensor's size in bytes overflows 64 bits");
  CHECK_THROWS_WITH(Layout(m, {Replicate(), Replicate()}, {4, 4}).local_box(8),
                    "rank 8 is not in this mesh of 8 ranks");
}
