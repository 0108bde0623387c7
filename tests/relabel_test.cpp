#include <catch2/catch.hpp>

#include <dtensor/dtensor.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

using namespace dtensor;
using Catch::Matchers::Contains;

namespace {

Layout layout(const DeviceMesh& mesh, const char* placements, const Shape& shape,
              DType dtype = DType::f32) {
  return Layout(mesh, parse_placements(placements), shape, dtype);
}

// Whether r.ranks() is a permutation of 0..n-1.
bool is_permutation(const Relabelling& r) {
  std::vector<int> seen(static_cast<std::size_t>(r.size()), 0);
  for (const int p : r.ranks()) {
    if (p < 0 || p >= r.size() || seen[static_cast<std::size_t>(p)]++ > 0) return false;
  }
  return true;
}

struct Bytes {
  std::int64_t max = 0;
  std::int64_t total = 0;
};

// The bytes received when target block q goes to rank_for[q], from the definition.
Bytes bytes_of(const Layout& src, const Layout& dst, const std::vector<int>& rank_for) {
  Bytes b;
  for (int q = 0; q < static_cast<int>(rank_for.size()); ++q) {
    const std::int64_t r = relabel_bytes_recv(src, dst, rank_for[static_cast<std::size_t>(q)], q);
    b.max = std::max(b.max, r);
    b.total += r;
  }
  return b;
}

std::vector<int> ranks_of(const Relabelling& r) { return {r.ranks().begin(), r.ranks().end()}; }

// Checks that the reported bytes are those of the reported ranks.
void check_reported_bytes(const Layout& src, const Layout& dst, const Relabelling& r) {
  REQUIRE(is_permutation(r));
  std::vector<int> identity(static_cast<std::size_t>(r.size()));
  std::iota(identity.begin(), identity.end(), 0);
  const Bytes before = bytes_of(src, dst, identity), after = bytes_of(src, dst, ranks_of(r));
  CHECK(r.bytes_recv_max_before() == before.max);
  CHECK(r.bytes_recv_total_before() == before.total);
  CHECK(r.bytes_recv_max_after() == after.max);
  CHECK(r.bytes_recv_total_after() == after.total);
  CHECK(r.moves_nothing() == (after.total == 0));
  CHECK(r.is_identity() == (ranks_of(r) == identity));
  CHECK(r.bytes_recv_total_after() <= r.bytes_recv_total_before());
}

// A random mesh of n ranks with 1 to 3 dims.
DeviceMesh random_mesh(int n, std::mt19937& rng) {
  MeshShape extents;
  const int dims = std::uniform_int_distribution<int>(1, 3)(rng);
  int rest = n;
  for (int k = 0; k + 1 < dims; ++k) {
    std::vector<int> divisors;
    for (int d = 1; d <= rest; ++d)
      if (rest % d == 0) divisors.push_back(d);
    const int d = divisors[std::uniform_int_distribution<std::size_t>(0, divisors.size() - 1)(rng)];
    extents.push_back(d);
    rest /= d;
  }
  extents.push_back(rest);
  return DeviceMesh(extents);
}

// Random R or S(d) placements for a tensor of `ndim` dims.
Placements random_placements(const DeviceMesh& mesh, int ndim, std::mt19937& rng) {
  Placements ps;
  for (int k = 0; k < mesh.ndim(); ++k) {
    const int pick = std::uniform_int_distribution<int>(-1, ndim - 1)(rng);
    ps.push_back(pick < 0 ? Placement::replicate() : Placement::shard(pick));
  }
  return ps;
}

// A random shape of 1 to 3 dims: multiples of 12 (even on most meshes) or anything up to 13.
Shape random_shape(std::mt19937& rng) {
  Shape s;
  const int ndim = std::uniform_int_distribution<int>(1, 3)(rng);
  const bool even = std::uniform_int_distribution<int>(0, 1)(rng) == 0;
  for (int d = 0; d < ndim; ++d)
    s.push_back(even ? 12 * std::uniform_int_distribution<int>(1, 2)(rng)
                     : std::uniform_int_distribution<int>(1, 13)(rng));
  return s;
}

struct RandomPair {
  Layout src;
  Layout dst;
};

RandomPair random_pair(int n, std::mt19937& rng) {
  const DeviceMesh a = random_mesh(n, rng);
  const DeviceMesh b = std::uniform_int_distribution<int>(0, 2)(rng) == 0 ? a : random_mesh(n, rng);
  const Shape shape = random_shape(rng);
  const int ndim = static_cast<int>(shape.size());
  constexpr DType dtypes[] = {DType::f32, DType::bf16, DType::i64};
  const DType dtype = dtypes[std::uniform_int_distribution<int>(0, 2)(rng)];
  const ChunkPolicy policy = std::uniform_int_distribution<int>(0, 3)(rng) == 0
                                 ? ChunkPolicy::balanced
                                 : ChunkPolicy::torch_chunk;
  return {Layout(a, random_placements(a, ndim, rng), shape, dtype, policy),
          Layout(b, random_placements(b, ndim, rng), shape, dtype, policy)};
}

}  // namespace

TEST_CASE("layouts that differ by a permutation of ranks move nothing once relabelled") {
  SECTION("2x4 (S(0), S(1)) and 4x2 (S(1), S(0))") {
    const Layout a = layout(DeviceMesh({2, 4}), "S(0),S(1)", {8, 8});
    const Layout b = layout(DeviceMesh({4, 2}), "S(1),S(0)", {8, 8});
    for (const RelabelMethod m :
         {RelabelMethod::automatic, RelabelMethod::exact, RelabelMethod::greedy}) {
      const Relabelling r = find_relabelling(a, b, m);
      check_reported_bytes(a, b, r);
      CHECK(r.moves_nothing());
      CHECK_FALSE(r.is_identity());
      CHECK(ranks_of(r) == std::vector<int>{0, 4, 1, 5, 2, 6, 3, 7});
      CHECK(r.bytes_recv_max_before() == 8 * 4);
      CHECK(r.method() == (m == RelabelMethod::greedy ? m : RelabelMethod::exact));
    }
  }
  SECTION("2x2 (S(0), S(1)) and (S(1), S(0)), uneven") {
    const DeviceMesh mesh({2, 2});
    const Layout a = layout(mesh, "S(0),S(1)", {5, 7}, DType::bf16);
    const Layout b = layout(mesh, "S(1),S(0)", {5, 7}, DType::bf16);
    const Relabelling r = find_relabelling(a, b);
    check_reported_bytes(a, b, r);
    CHECK(r.moves_nothing());
    CHECK(ranks_of(r) == std::vector<int>{0, 2, 1, 3});
    CHECK(r.bytes_recv_max_before() == lower_bound_bytes_recv_max(a, b));
  }
  SECTION("a 1-D mesh of 8 and 2x4 sharding the same dim twice: already in place") {
    const Layout a = layout(DeviceMesh({8}), "S(0)", {16, 4});
    const Layout b = layout(DeviceMesh({2, 4}), "S(0),S(0)", {16, 4});
    const Relabelling r = find_relabelling(a, b);
    CHECK(r.is_identity());
    CHECK(r.moves_nothing());
    CHECK(r.bytes_recv_total_before() == 0);
  }
  SECTION("with replicas: 2x4 (S(0), R) and 4x2 (R, S(0))") {
    const Layout a = layout(DeviceMesh({2, 4}), "S(0),R", {6, 3});
    const Layout b = layout(DeviceMesh({4, 2}), "R,S(0)", {6, 3});
    const Relabelling r = find_relabelling(a, b);
    check_reported_bytes(a, b, r);
    CHECK(r.moves_nothing());
    CHECK(find_relabelling(a, b, RelabelMethod::greedy).moves_nothing());
  }
  SECTION("random layouts on permuted meshes") {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 300; ++trial) {
      MeshShape extents;
      const int dims = std::uniform_int_distribution<int>(1, 4)(rng);
      for (int k = 0; k < dims; ++k)
        extents.push_back(std::uniform_int_distribution<int>(1, 4)(rng));
      const Shape shape = random_shape(rng);
      const int ndim = static_cast<int>(shape.size());
      // Each tensor dim sharded by one mesh dim at most: permuting the mesh dims permutes
      // the blocks.
      Placements ps;
      std::vector<int> free_dims(static_cast<std::size_t>(ndim));
      std::iota(free_dims.begin(), free_dims.end(), 0);
      std::shuffle(free_dims.begin(), free_dims.end(), rng);
      for (int k = 0; k < dims; ++k) {
        if (!free_dims.empty() && std::uniform_int_distribution<int>(0, 2)(rng) > 0) {
          ps.push_back(Placement::shard(free_dims.back()));
          free_dims.pop_back();
        } else {
          ps.push_back(Placement::replicate());
        }
      }
      std::vector<int> order(static_cast<std::size_t>(dims));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      MeshShape permuted_extents;
      Placements permuted;
      for (const int k : order) {
        permuted_extents.push_back(extents[static_cast<std::size_t>(k)]);
        permuted.push_back(ps[static_cast<std::size_t>(k)]);
      }
      const Layout a(DeviceMesh(extents), ps, shape);
      const Layout b(DeviceMesh(permuted_extents), permuted, shape);
      INFO(fmt::format("{} -> {}", a, b));
      const Relabelling exact = find_relabelling(a, b, RelabelMethod::exact);
      const Relabelling greedy = find_relabelling(a, b, RelabelMethod::greedy);
      check_reported_bytes(a, b, exact);
      check_reported_bytes(a, b, greedy);
      CHECK(exact.moves_nothing());
      CHECK(greedy.moves_nothing());
    }
  }
}

TEST_CASE("the identity when it is already optimal") {
  const DeviceMesh mesh({2, 4});
  const Shape shape{16, 8};
  for (const char* p : {"S(0),R", "R,S(1)", "S(0),S(1)", "R,R", "S(1),S(0)"}) {
    const Layout l = layout(mesh, p, shape);
    const Relabelling r = find_relabelling(l, l);
    CHECK(r.is_identity());
    CHECK(r.moves_nothing());
    CHECK(r.bytes_recv_max_before() == 0);
  }
  // Every rank needs the whole tensor and holds an equal part: every relabelling ties.
  const Relabelling gather =
      find_relabelling(layout(mesh, "S(0),S(1)", shape), layout(mesh, "R,R", shape));
  CHECK(gather.is_identity());
  CHECK(gather.bytes_recv_total_after() == gather.bytes_recv_total_before());
  CHECK(gather.bytes_recv_max_after() == 16 * 8 * 4 * 7 / 8);
}

TEST_CASE("the bytes before relabelling are the planner's lower bound") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 12)(rng);
    const DeviceMesh mesh = random_mesh(n, rng);
    const Shape shape = random_shape(rng);
    const int ndim = static_cast<int>(shape.size());
    const Layout a(mesh, random_placements(mesh, ndim, rng), shape, DType::bf16);
    const Layout b(mesh, random_placements(mesh, ndim, rng), shape, DType::bf16);
    INFO(fmt::format("{} -> {}", a, b));
    const Relabelling r = find_relabelling(a, b);
    CHECK(r.bytes_recv_max_before() == lower_bound_bytes_recv_max(a, b));
    check_reported_bytes(a, b, r);
  }
}

TEST_CASE("exact is optimal and greedy no better, on random layouts") {
  std::mt19937 rng(2024);
  SECTION("exact equals brute force over every permutation on up to 6 ranks") {
    for (int trial = 0; trial < 600; ++trial) {
      const int n = std::uniform_int_distribution<int>(1, 6)(rng);
      const RandomPair pair = random_pair(n, rng);
      const Layout& a = pair.src;
      const Layout& b = pair.dst;
      INFO(fmt::format("{} -> {}", a, b));
      std::vector<int> perm(static_cast<std::size_t>(n));
      std::iota(perm.begin(), perm.end(), 0);
      const std::int64_t identity_total = bytes_of(a, b, perm).total;
      std::int64_t best = identity_total;
      do {
        best = std::min(best, bytes_of(a, b, perm).total);
      } while (std::next_permutation(perm.begin(), perm.end()));
      const Relabelling exact = find_relabelling(a, b, RelabelMethod::exact);
      const Relabelling greedy = find_relabelling(a, b, RelabelMethod::greedy);
      check_reported_bytes(a, b, exact);
      check_reported_bytes(a, b, greedy);
      CHECK(exact.bytes_recv_total_after() == best);
      CHECK(greedy.bytes_recv_total_after() >= best);
      if (identity_total == best) CHECK(exact.is_identity());
      CHECK(find_relabelling(a, b) == exact);
    }
  }
  SECTION("the gap between greedy and exact on 8 to 128 ranks") {
    int pairs = 0, greedy_optimal = 0;
    double excess = 0, worst = 0;
    std::int64_t exact_saved = 0, greedy_saved = 0;
    for (int trial = 0; trial < 2000; ++trial) {
      constexpr int sizes[] = {8, 12, 16, 24, 32, 48, 64, 96, 128};
      const int n = sizes[std::uniform_int_distribution<std::size_t>(0, std::size(sizes) - 1)(rng)];
      const RandomPair pair = random_pair(n, rng);
      INFO(fmt::format("{} -> {}", pair.src, pair.dst));
      const Relabelling exact = find_relabelling(pair.src, pair.dst, RelabelMethod::exact);
      const Relabelling greedy = find_relabelling(pair.src, pair.dst, RelabelMethod::greedy);
      check_reported_bytes(pair.src, pair.dst, exact);
      check_reported_bytes(pair.src, pair.dst, greedy);
      REQUIRE(greedy.bytes_recv_total_after() >= exact.bytes_recv_total_after());
      const std::int64_t before = exact.bytes_recv_total_before();
      if (before == exact.bytes_recv_total_after()) continue;  // nothing to gain
      ++pairs;
      exact_saved += before - exact.bytes_recv_total_after();
      greedy_saved += before - greedy.bytes_recv_total_after();
      greedy_optimal += greedy.bytes_recv_total_after() == exact.bytes_recv_total_after() ? 1 : 0;
      const double e =
          static_cast<double>(greedy.bytes_recv_total_after() - exact.bytes_recv_total_after()) /
          static_cast<double>(before);
      excess += e;
      worst = std::max(worst, e);
    }
    REQUIRE(pairs > 0);
    WARN(fmt::format(
        "relabelling, {} random pairs where relabelling helps: greedy optimal in {:.0f}%, greedy "
        "saves {:.1f}% of what exact saves; greedy's excess over exact: mean {:.2f}%, worst "
        "{:.1f}% of the bytes before",
        pairs, 100.0 * greedy_optimal / pairs,
        100.0 * static_cast<double>(greedy_saved) / static_cast<double>(exact_saved),
        100.0 * excess / pairs, 100.0 * worst));
  }
}

TEST_CASE("large meshes: automatic picks greedy beyond max_exact_relabel_ranks") {
  const Layout a = layout(DeviceMesh({16, 64}), "S(0),S(1)", {64, 128});
  const Layout b = layout(DeviceMesh({64, 16}), "S(1),S(0)", {64, 128});
  const Relabelling r = find_relabelling(a, b);
  CHECK(r.method() == RelabelMethod::greedy);
  CHECK(r.size() == 1024);
  CHECK(r.moves_nothing());
  CHECK(r.bytes_recv_max_before() > 0);
  check_reported_bytes(a, b, r);

  const Layout c = layout(DeviceMesh({8, 8, 8}), "S(0),S(1),R", {64, 64});
  const Layout d = layout(DeviceMesh({8, 8, 8}), "R,S(1),S(0)", {64, 64});
  CHECK(find_relabelling(c, d).method() == RelabelMethod::exact);
  CHECK(find_relabelling(c, d).moves_nothing());

  const Layout e = layout(DeviceMesh({max_relabel_ranks}), "S(0)", {8192});
  const Layout f = layout(DeviceMesh({64, 64}), "S(0),S(0)", {8192});
  CHECK(find_relabelling(e, f).is_identity());
  CHECK(find_relabelling(e, f).moves_nothing());
}

TEST_CASE("relabelling refuses what it cannot do") {
  const DeviceMesh mesh({2, 4});
  const Shape shape{8, 8};
  CHECK_THROWS_WITH(find_relabelling(layout(mesh, "P,R", shape), layout(mesh, "R,R", shape)),
                    Contains("a Partial block is not the value: the source layout has P(sum) "
                             "on mesh dim 0"));
  CHECK_THROWS_WITH(
      find_relabelling(layout(mesh, "R,R", shape), layout(mesh, "S(0),P(max)", shape)),
      Contains("the target layout has P(max) on mesh dim 1"));
  CHECK_THROWS_AS(find_relabelling(layout(mesh, "P,R", shape), layout(mesh, "P,R", shape)),
                  dtensor::error);
  CHECK_THROWS_WITH(
      find_relabelling(layout(mesh, "R,R", shape), layout(DeviceMesh({3, 3}), "R,R", shape)),
      "relabelling needs meshes with the same number of ranks: 2x4 has 8 and 3x3 "
      "has 9");
  CHECK_THROWS_WITH(find_relabelling(layout(mesh, "R,R", shape), layout(mesh, "R,R", {8, 9})),
                    "the two layouts describe different tensors: shapes 8x8 and 8x9");
  CHECK_THROWS_WITH(
      find_relabelling(layout(mesh, "R,R", shape), layout(mesh, "R,R", shape, DType::bf16)),
      "the two layouts have different dtypes: f32 and bf16");
  const Layout big = layout(DeviceMesh({max_relabel_ranks + 1}), "S(0)", {8});
  CHECK_THROWS_WITH(find_relabelling(big, big), "relabelling handles at most 4096 ranks, got 4097");
  const Layout wide = layout(DeviceMesh({2, 512}), "S(0),R", {8});
  CHECK_THROWS_WITH(find_relabelling(wide, wide, RelabelMethod::exact),
                    Contains("the exact relabelling handles at most 512 ranks, got 1024"));
  const Layout small = layout(mesh, "S(0),R", shape);
  CHECK_THROWS_WITH(find_relabelling(small, small).rank_for(8),
                    "index 8 is out of range for a size of 8");
  CHECK_THROWS_AS(relabel_bytes_recv(small, small, 0, 8), dtensor::error);
}

TEST_CASE("relabellings in words") {
  const Layout a = layout(DeviceMesh({2, 2}), "S(0),S(1)", {1024, 1024});
  const Layout b = layout(DeviceMesh({2, 2}), "S(1),S(0)", {1024, 1024});
  const Relabelling r = find_relabelling(a, b);
  CHECK(describe(r) ==
        "relabel ranks as [0, 2, 1, 3] (target block q goes to rank [q]; exact) and this "
        "redistribution moves 0 B (before: 1.00 MiB max per rank, 2.00 MiB in all)");
  CHECK(fmt::format("{}", r) ==
        "[0, 2, 1, 3] (exact): recv max 0 B, total 0 B (before: recv max 1048576 B, total "
        "2097152 B)");
  CHECK(fmt::format("{}", RelabelMethod::greedy) == "greedy");
  CHECK(describe(find_relabelling(a, a)) ==
        "keep the ranks: every rank already holds its target block");
  const Layout all = layout(DeviceMesh({2, 2}), "R,R", {1024, 1024});
  CHECK(describe(find_relabelling(a, all, RelabelMethod::greedy)) ==
        "keep the ranks (greedy: no relabelling found receives fewer bytes): 3.00 MiB max per "
        "rank, 12.00 MiB in all");
  const Layout many = layout(DeviceMesh({10, 10}), "S(0),S(1)", {100, 100});
  const Layout other = layout(DeviceMesh({10, 10}), "S(1),S(0)", {100, 100});
  CHECK_THAT(describe(find_relabelling(many, other)), Contains(", ... 36 more]"));
}
