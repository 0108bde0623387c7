// PlanCache: remembered plans equal fresh ones, hits and misses counted, least recently used
// evicted, bad input remembered nowhere.
#include <catch2/catch.hpp>

#include <dtensor/dtensor.hpp>

#include <memory>

using namespace dtensor;

namespace {

Layout layout(const char* mesh, const char* placements, Shape shape) {
  return {parse_mesh(mesh), parse_placements(placements), shape, DType::bf16};
}

}  // namespace

TEST_CASE("a plan cache answers with the plan plan_redistribute makes", "[plan_cache]") {
  auto cache = std::make_unique<PlanCache<4>>();
  const Layout a = layout("2x4", "S(0),R", {1024, 4096});
  const Layout b = layout("2x4", "R,S(0)", {1024, 4096});
  const Plan& first = cache->get(a, b);
  CHECK(first == plan_redistribute(a, b));
  CHECK(cache->misses() == 1);
  CHECK(cache->hits() == 0);
  const Plan& again = cache->get(a, b);
  CHECK(&again == &first);
  CHECK(cache->hits() == 1);
  CHECK(cache->size() == 1);

  // Options are part of the key.
  const PlanOptions bytes{.objective = Objective::bytes};
  CHECK(cache->get(a, b, bytes) == plan_redistribute(a, b, bytes));
  const PlanOptions no_exchange{.allow_exchange = false};
  CHECK(cache->get(a, b, no_exchange) == plan_redistribute(a, b, no_exchange));
  CHECK(cache->get(a, b, no_exchange).size() > 1);  // collectives only: several steps
  CHECK(cache->size() == 3);
  CHECK(cache->misses() == 3);
  CHECK(cache->hits() == 2);

  // So are the shape, the dtype and a cost model given explicitly.
  const Layout c = layout("2x4", "S(0),R", {1024, 2048});
  const Layout d = layout("2x4", "R,S(0)", {1024, 2048});
  CHECK(cache->get(c, d) == plan_redistribute(c, d));
  PlanOptions slow = PlanOptions{}.with_cost_model(CostModel::defaults(a.mesh()));
  slow.cost_model.p2p_latency_factor = 50;
  CHECK(cache->get(a, b, slow) == plan_redistribute(a, b, slow));
  CHECK(cache->size() == 4);
  CHECK(cache->misses() == 5);
}

TEST_CASE("a full plan cache forgets the least recently used plan", "[plan_cache]") {
  auto cache = std::make_unique<PlanCache<2>>();
  const Layout r = layout("8", "R", {64, 64});
  const Layout s0 = layout("8", "S(0)", {64, 64});
  const Layout s1 = layout("8", "S(1)", {64, 64});
  cache->get(s0, r);   // miss
  cache->get(s0, s1);  // miss
  cache->get(s0, r);   // hit: s0 -> s1 is now the least recently used
  cache->get(s1, r);   // miss, evicts s0 -> s1
  CHECK(cache->size() == 2);
  CHECK(cache->misses() == 3);
  cache->get(s0, r);  // still there
  CHECK(cache->hits() == 2);
  CHECK(cache->get(s0, s1) == plan_redistribute(s0, s1));  // planned again
  CHECK(cache->misses() == 4);
  cache->clear();
  CHECK(cache->size() == 0);
  cache->get(s0, r);
  CHECK(cache->misses() == 5);
}

TEST_CASE("a plan cache remembers nothing for bad input", "[plan_cache]") {
  auto cache = std::make_unique<PlanCache<2>>();
  const Layout a = layout("2x4", "S(0),R", {16, 16});
  const Layout other_shape = layout("2x4", "R,S(0)", {16, 8});
  CHECK_THROWS_AS(cache->get(a, other_shape), error);
  CHECK(cache->size() == 0);
  CHECK(cache->misses() == 0);
}
