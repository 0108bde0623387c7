#include <catch2/catch.hpp>

// Before dtensor, as a program that formats its own ranges may include it.
#include <fmt/ranges.h>

#include <dtensor/dtensor.hpp>

#include <fmt/format.h>

#include <string>
#include <vector>

using namespace dtensor;

TEST_CASE("formatters print the spellings the parser reads", "[format]") {
  CHECK(fmt::format("{}", Placement(Shard(1))) == "S(1)");
  CHECK(fmt::format("{}", Placement(Replicate())) == "R");
  CHECK(fmt::format("{}", Placement(Partial(ReduceOp::max))) == "P(max)");
  CHECK(fmt::format("{}", DType::bf16) == "bf16");
  CHECK(fmt::format("{}", ReduceOp::avg) == "avg");
  CHECK(fmt::format("{}", ChunkPolicy::balanced) == "balanced");
  CHECK(fmt::format("{:>6}|", Placement(Shard(0))) == "  S(0)|");
  const Placements ps{Shard(0), Replicate(), Partial()};
  CHECK(fmt::format("{}", ps) == "[S(0), R, P(sum)]");
  CHECK(parse_placements(fmt::format("{}", ps)) == ps);
  CHECK(fmt::format("{}", Shape{1024, 4096}) == "[1024, 4096]");
  CHECK(fmt::format("{}", MeshCoord{0, 1}) == "[0, 1]");
}

TEST_CASE("fmt/ranges.h formats other ranges and leaves dtensor's to dtensor", "[format]") {
  CHECK(fmt::format("{} {}", std::vector<int>{1, 2}, Shape{3, 4}) == "[1, 2] [3, 4]");
  CHECK(fmt::format("{}", Placements{Shard(0), Partial()}) == "[S(0), P(sum)]");
  const DeviceMesh m({4});
  const Plan p = plan_redistribute(Layout(m, {Shard(0)}, {8}, DType::f32),
                                   Layout(m, {Replicate()}, {8}, DType::f32));
  CHECK(fmt::format("{}", p).rfind("[S(0)] -> [R]: 1 steps", 0) == 0);
}

TEST_CASE("meshes, groups, boxes and layouts", "[format]") {
  const DeviceMesh m({2, 4}, {"dp", "tp"});
  CHECK(fmt::format("{}", DeviceMesh({2, 4})) == "2x4");
  CHECK(fmt::format("{}", m) == "2x4 (dp, tp)");
  CHECK(fmt::format("{}", m.group(6, 0)) == "{2, 6} (index 1)");
  const Layout l(m, {Shard(0), Replicate()}, {1024, 4096}, DType::bf16);
  CHECK(fmt::format("{}", l.local_box(5)) == "[512:1024, 0:4096]");
  CHECK(fmt::format("{}", l) == "Layout(mesh 2x4 (dp, tp), [S(0), R], shape [1024, 4096], bf16)");
  const Layout b(DeviceMesh({3}), {Shard(0)}, {5}, DType::i64, ChunkPolicy::balanced);
  CHECK(fmt::format("{}", b) == "Layout(mesh 3, [S(0)], shape [5], i64, balanced)");
}

TEST_CASE("sharding picture of a 2-D tensor", "[format][visualize]") {
  const Layout l(DeviceMesh({2, 2}), {Shard(0), Shard(1)}, {4, 6});
  const std::string expected =
      "      0:3   3:6\n"
      "    ┌─────┬─────┐\n"
      "0:2 │  0  │  1  │\n"
      "    ├─────┼─────┤\n"
      "2:4 │  2  │  3  │\n"
      "    └─────┴─────┘\n";
  CHECK(sharding_picture(l) == expected);
}

TEST_CASE("sharding picture folds replicas and notes partials and empty ranks",
          "[format][visualize]") {
  const Layout l(DeviceMesh({2, 4}), {Partial(), Shard(0)}, {5});
  const std::string expected =
      "  0:2    2:4    4:5\n"
      "┌──────┬──────┬──────┐\n"
      "│ 0, 4 │ 1, 5 │ 2, 6 │\n"
      "└──────┴──────┴──────┘\n"
      "partial over mesh dim 0: each cell's ranks hold parts whose sum is the value\n"
      "ranks holding no elements: 3, 7\n";
  CHECK(sharding_picture(l) == expected);

  const Layout r(DeviceMesh({2, 4}, {"dp", "tp"}), {Shard(0), Replicate()}, {8, 8});
  CHECK(sharding_picture(r) ==
        "      0:8\n"
        "    ┌─────┐\n"
        "0:4 │ 0-3 │\n"
        "    ├─────┤\n"
        "4:8 │ 4-7 │\n"
        "    └─────┘\n");
}

TEST_CASE("sharding picture of other ranks lists blocks", "[format][visualize]") {
  const Layout l(DeviceMesh({2}), {Shard(2)}, {2, 2, 4});
  CHECK(sharding_picture(l) == "rank 0: [0:2, 0:2, 0:2]\nrank 1: [0:2, 0:2, 2:4]\n");
  const Layout big(DeviceMesh({64}), {Shard(0)}, {64});
  CHECK(sharding_picture(big) == "(1 x 64 blocks: too many to draw)\n");
}
