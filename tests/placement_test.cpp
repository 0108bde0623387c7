#include <catch2/catch.hpp>

#include <dtensor/placement.hpp>

#include <unordered_set>

using namespace dtensor;

TEST_CASE("placements compare by kind, dim and op", "[placement]") {
  CHECK(Placement(Shard(0)) == Placement::shard(0));
  CHECK(Placement(Shard(0)) != Placement(Shard(1)));
  CHECK(Placement(Replicate()) == Placement());
  CHECK(Placement(Partial()) == Placement::partial(ReduceOp::sum));
  CHECK(Placement(Partial(ReduceOp::max)) != Placement(Partial()));
  CHECK(Placement(Partial()) != Placement(Replicate()));
  CHECK(Placement(Shard<1>{}) == Placement(Shard(1)));
  CHECK(Placement(Partial<ReduceOp::min>{}) == Placement::partial(ReduceOp::min));
}

TEST_CASE("placement predicates", "[placement]") {
  const Placement s = Shard(2), r = Replicate(), p = Partial(ReduceOp::avg);
  CHECK(s.is_shard());
  CHECK(s.is_shard(2));
  CHECK_FALSE(s.is_shard(1));
  CHECK(s.dim() == 2);
  CHECK(is_replicate(r));
  CHECK_FALSE(is_shard(r));
  CHECK(is_partial(p));
  CHECK(p.is_partial(ReduceOp::avg));
  CHECK_FALSE(p.is_partial(ReduceOp::sum));
  CHECK(p.reduce_op() == ReduceOp::avg);
  CHECK(has_partial(Placements{r, p}));
  CHECK_FALSE(has_partial(Placements{r, s}));
}

TEST_CASE("negative shard dims are kept until a layout resolves them", "[placement]") {
  const Placement s = Shard(-1);
  CHECK(s.dim() == -1);
  CHECK(s != Placement(Shard(1)));
}

TEST_CASE("a non-shard has no tensor dim", "[placement][errors]") {
  CHECK_THROWS_WITH(Placement(Replicate()).dim(),
                    "placement Replicate is not a Shard and has no tensor dim");
  CHECK_THROWS_AS(Placement::shard(8), error);
  CHECK_THROWS_WITH(Placement::shard(-9), "Shard(-9) is out of range: tensors have at most 8 dims");
}

TEST_CASE("placements hash consistently with equality", "[placement]") {
  std::unordered_set<Placement> set;
  for (int d = -max_tensor_dims; d < max_tensor_dims; ++d) set.insert(Shard(d));
  for (ReduceOp op : all_reduce_ops) set.insert(Partial(op));
  set.insert(Replicate());
  set.insert(Replicate());
  set.insert(Shard(0));
  CHECK(set.size() == 2 * max_tensor_dims + 5 + 1);
  CHECK(std::hash<Placement>{}(Shard(3)) == std::hash<Placement>{}(Placement::shard(3)));
}

TEST_CASE("reduce ops know their algebra", "[placement]") {
  CHECK(is_idempotent(ReduceOp::max));
  CHECK(is_idempotent(ReduceOp::min));
  CHECK_FALSE(is_idempotent(ReduceOp::sum));
  CHECK(is_linear(ReduceOp::sum));
  CHECK(is_linear(ReduceOp::avg));
  CHECK_FALSE(is_linear(ReduceOp::product));
  CHECK(name(ReduceOp::product) == "product");
}
