// docs/bad_inputs.md, row by row: every bad input gets the error the table says (and nothing
// crashes, hangs or answers wrong). Rows checked elsewhere name their test in the table.
#include <catch2/catch.hpp>

#include <dtensor/backend/simulated.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/verify.hpp>

#include "forwarding_backend.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

using namespace dtensor;

namespace {

Layout layout(const DeviceMesh& m, const char* placements, const Shape& shape,
              DType dtype = DType::f32) {
  return Layout(m, parse_placements(placements), shape, dtype);
}

// Runs `plan` on simulated ranks, each with its block of the global view; returns each rank's
// result and leaves each rank's source in `sources`.
template <class T>
std::vector<std::vector<T>> run(const Plan& plan, std::vector<std::vector<T>>& sources,
                                std::size_t short_rank = ~std::size_t{0}) {
  const int ranks = plan.src().mesh().size();
  std::vector<std::vector<T>> out(static_cast<std::size_t>(ranks));
  SimulatedWorld world(plan.src().mesh());
  world.run([&](SimulatedBackend& b) {
    const auto r = static_cast<std::size_t>(b.rank());
    out[r].resize(static_cast<std::size_t>(plan.dst().local_numel(b.rank())));
    std::span<T> dst(out[r]);
    if (r == short_rank) dst = dst.first(dst.size() - 1);
    execute(plan, b, std::span<const T>(sources[r]), dst);
  });
  return out;
}

template <class T>
std::vector<std::vector<T>> global_view_sources(const Layout& l) {
  std::vector<std::vector<T>> s;
  for (int r = 0; r < l.mesh().size(); ++r) s.push_back(global_view_block<T>(l, r));
  return s;
}

// A SimulatedBackend that reduces only some dtypes and ops, as an older NCCL would.
struct RestrictedBackend : testing::ForwardingBackend<SimulatedBackend> {
  using ForwardingBackend::ForwardingBackend;
  [[nodiscard]] static constexpr bool supports(DType dtype, ReduceOp op) {
    return op != ReduceOp::avg && dtype != DType::bf16;
  }
};
static_assert(Backend<RestrictedBackend>);

}  // namespace

TEST_CASE("mismatched meshes, shapes or dtypes between source and target", "[bad]") {
  const DeviceMesh m({2, 4}), other({4, 2});
  CHECK_THROWS_WITH(plan_redistribute(layout(m, "S(0),R", {8, 8}), layout(other, "R,R", {8, 8})),
                    "the two layouts live on different meshes: 2x4 and 4x2 (or other names or "
                    "ranks)");
  CHECK_THROWS_WITH(plan_redistribute(layout(m, "S(0),R", {8, 8}), layout(m, "R,R", {8, 9})),
                    "the two layouts describe different tensors: shapes 8x8 and 8x9");
  CHECK_THROWS_WITH(
      plan_redistribute(layout(m, "S(0),R", {8, 8}), layout(m, "R,R", {8, 8}, DType::bf16)),
      "the two layouts have different dtypes: f32 and bf16");
}

TEST_CASE("dims out of range", "[bad]") {
  const DeviceMesh m({2, 4});
  CHECK_THROWS_WITH(layout(m, "S(2),R", {8, 8}), "Shard(2) is out of range for a tensor of 2 dims");
  CHECK_THROWS_WITH(layout(m, "S(-3),R", {8, 8}),
                    "Shard(-3) is out of range for a tensor of 2 dims");
  CHECK_THROWS_WITH(m.size(2), "mesh dim 2 is out of range for a mesh of 2 dims");
  CHECK_THROWS_WITH(m.coordinate(8), "rank 8 is not in this mesh of 8 ranks");
  CHECK_THROWS_WITH(layout(m, "S(0),R,R", {8, 8}),
                    "3 placements for a mesh of 2 dims: one per mesh dim");
  CHECK_THROWS_WITH(layout(m, "S(0),R", {8, -3}), "tensor dim 1 has negative size -3");
}

TEST_CASE("more than 8 mesh dims, and zero-size meshes", "[bad]") {
  CHECK_THROWS_WITH(parse_mesh("1x1x1x1x1x1x1x1x1"), "a device mesh has at most 8 dims, got 9");
  CHECK_THROWS_WITH(DeviceMesh({1, 1, 1, 1, 1, 1, 1, 1, 1}),
                    "too many elements: at most 8 fit, got 9");
  CHECK_THROWS_WITH(DeviceMesh({2, 0}), "mesh dim 1 has extent 0: extents must be at least 1");
  CHECK_THROWS_WITH(DeviceMesh(MeshShape{}), "a device mesh needs at least 1 dim, got 0");
  CHECK_THROWS_WITH(parse_mesh("2x0"),
                    "cannot read '2x0' as a mesh: expected sizes joined by 'x', e.g. 2x4");
}

TEST_CASE("buffers too small for the local blocks", "[bad][execute]") {
  const DeviceMesh m({4});
  const Plan plan = plan_redistribute(layout(m, "S(0)", {8, 4}), layout(m, "R", {8, 4}));
  SimulatedWorld world(m);
  std::mutex mutex;
  std::vector<std::string> messages;
  auto record = [&](const error& e) {
    const std::lock_guard lock(mutex);
    messages.emplace_back(e.what());
  };
  world.run([&](SimulatedBackend& b) {
    std::vector<float> src(8), dst(32);
    try {
      execute(plan, b, src.data(), src.size() * 4 - 1, dst.data(), dst.size() * 4);
    } catch (const error& e) {
      record(e);
    }
    try {
      execute(plan, b, src.data(), src.size() * 4, dst.data(), 12);
    } catch (const error& e) {
      record(e);
    }
  });
  REQUIRE(messages.size() == 8);
  CHECK(std::count(messages.begin(), messages.end(),
                   "the source buffer holds 31 bytes, but rank 0 needs 32") == 1);
  CHECK(std::count(messages.begin(), messages.end(),
                   "the target buffer holds 12 bytes, but rank 3 needs 128") == 1);
}

TEST_CASE("source and target buffers that overlap", "[bad][execute]") {
  // A source that overlaps the target anywhere but at this rank's slab of an all-gather's target
  // (one element in) is refused before anything moves, on every rank, and no buffer is written;
  // at the slab (MPI_IN_PLACE's layout) the all-gather runs in place; the blocks side by side in
  // one allocation run.
  const DeviceMesh m({4});
  const Layout from = layout(m, "S(0)", {8, 4}), to = layout(m, "R", {8, 4});
  const Plan plan = plan_redistribute(from, to);
  SimulatedWorld world(m);
  std::mutex mutex;
  std::vector<std::string> messages;
  world.run([&](SimulatedBackend& b) {
    const int r = b.rank();
    std::vector<float> target(33, -1.0f);
    try {
      execute(plan, b, target.data() + 8 * r + 1, 32, target.data(), 128);
    } catch (const error& e) {
      const std::lock_guard lock(mutex);
      messages.emplace_back(e.what());
    }
    CHECK(std::all_of(target.begin(), target.end(), [](float v) { return v == -1.0f; }));
    const std::vector<float> mine = global_view_block<float>(from, r);
    std::copy(mine.begin(), mine.end(), target.begin() + 8 * r);
    execute(plan, b, target.data() + 8 * r, 32, target.data(), 128);
    const std::vector<float> whole = global_view_block<float>(to, r);
    CHECK(std::equal(whole.begin(), whole.end(), target.begin()));
    std::vector<float> both(40, 1.0f);  // the target, then the source right after it
    execute(plan, b, both.data() + 32, 32, both.data(), 128);
    CHECK(std::all_of(both.begin(), both.end(), [](float v) { return v == 1.0f; }));
  });
  REQUIRE(messages.size() == 4);
  CHECK(std::count(messages.begin(), messages.end(),
                   "the source and target buffers overlap on rank 2 (32 bytes in common): the "
                   "source is never written, so the target must be a buffer of its own (in "
                   "place, only a plan of all-reduces and scales runs in one buffer, and an "
                   "all-gather of slabs from this rank's slab of its target)") == 1);
  // A column all-gather's pieces are not slabs of the target: refused even at the slot.
  const Plan columns = plan_redistribute(layout(m, "S(1)", {4, 8}), layout(m, "R", {4, 8}));
  CHECK_THROWS_WITH(world.run([&](SimulatedBackend& b) {
    std::vector<float> target(32);
    execute(columns, b, target.data() + 8 * b.rank(), 32, target.data(), 128);
  }),
                    Catch::Contains("overlap on rank"));
}

namespace {

// Runs `plan` on every rank with its source and target in one buffer (`out`, holding the source
// first).
template <class T>
void run_in_one_buffer(const Plan& plan, std::vector<std::vector<T>>& in,
                       std::vector<std::vector<T>>& out, std::vector<RankBytes>& measured) {
  const DeviceMesh& m = plan.src().mesh();
  SimulatedWorld world(m);
  world.run([&](SimulatedBackend& backend) {
    const auto i = static_cast<std::size_t>(m.index_of(backend.rank()));
    out[i] = in[i];
    execute(plan, backend, out[i].data(), out[i].size() * sizeof(T), out[i].data(),
            out[i].size() * sizeof(T));
  });
  for (int r = 0; r < m.size(); ++r) measured.push_back(world.bytes(m.rank_at(r)));
}

}  // namespace

TEST_CASE("a plan of all-reduces and scales runs in place, in one buffer", "[execute]") {
  // Gradients all-reduced in place (P -> R, on either mesh dim, sum and average, f32 and
  // bf16) and a Replicate made Partial in place (a scale) give every rank its block of the global
  // view; a reduce-scatter in one buffer is refused.
  struct Case {
    const char* mesh;
    const char* from;
    const char* to;
  };
  for (const Case& c :
       {Case{"4", "P", "R"}, Case{"2x2", "R,P", "R,R"}, Case{"2x2", "P(avg),R", "R,R"},
        Case{"4", "R", "P"}, Case{"2x2", "R,R", "P,P"}})
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const DeviceMesh m = parse_mesh(c.mesh);
      const Layout a(m, parse_placements(c.from), {8, 6}, dtype);
      const Layout b(m, parse_placements(c.to), {8, 6}, dtype);
      const Plan plan = plan_redistribute(a, b);
      CHECK(runs_in_place(plan));
      const Verification v = detail::visit_dtype(
          dtype, [&]<class T>() { return detail::verify_typed<T>(plan, &run_in_one_buffer<T>); });
      INFO(fmt::format("{} {} -> {} {}: {}", c.mesh, c.from, c.to, dtype, v.difference));
      CHECK(v.verified);
    }
  const DeviceMesh m({4});
  const Plan scatter = plan_redistribute(layout(m, "P", {8, 4}), layout(m, "S(0)", {8, 4}));
  static_assert(!runs_in_place(plan_redistribute(Layout(DeviceMesh({4}), {Partial()}, {8, 4}),
                                                 Layout(DeviceMesh({4}), {Shard(0)}, {8, 4}))));
  CHECK_FALSE(runs_in_place(scatter));
  CHECK_THROWS_WITH(SimulatedWorld(m).run([&](SimulatedBackend& backend) {
    std::vector<float> both(32);
    execute(scatter, backend, both.data(), 128, both.data(), 32);
  }),
                    Catch::Contains("overlap on rank"));
}

TEST_CASE("a span of another element type than the plan's", "[bad][execute]") {
  const DeviceMesh m({2});
  const Plan plan = plan_redistribute(layout(m, "S(0)", {4}), layout(m, "R", {4}));
  SimulatedWorld world(m);
  CHECK_THROWS_WITH(world.run([&](SimulatedBackend& b) {
    std::vector<std::int32_t> src(2), dst(4);
    execute(plan, b, std::span<const std::int32_t>(src), std::span<std::int32_t>(dst));
  }),
                    "a span of i32 for a plan of f32");
}

TEST_CASE("a reduction the dtype does not support", "[bad]") {
  const DeviceMesh m({4});
  for (DType dtype : {DType::i32, DType::i64, DType::u8})
    CHECK_THROWS_WITH(layout(m, "P(avg)", {8}, dtype),
                      "Partial(avg) needs a floating-point dtype, not " + std::string(name(dtype)) +
                          ": an integer average truncates and the sum behind it overflows; use "
                          "Partial(sum)");
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16})
    CHECK_NOTHROW(layout(m, "P(avg)", {8}, dtype));
}

TEST_CASE("a reduction the backend cannot perform", "[bad][execute]") {
  const DeviceMesh m({2, 2});
  const Plan plan = plan_redistribute(layout(m, "R,P(avg)", {4, 4}, DType::bf16),
                                      layout(m, "R,S(0)", {4, 4}, DType::bf16));
  const Plan fine = plan_redistribute(layout(m, "R,P(max)", {4, 4}), layout(m, "R,S(0)", {4, 4}));
  SimulatedWorld world(m);
  // Refused before anything moves, so every rank refuses: nobody waits.
  CHECK_THROWS_WITH(world.run([&](SimulatedBackend& inner) {
    RestrictedBackend b(inner);
    std::vector<bf16_t> src(16), dst(8);
    execute(plan, b, std::span<const bf16_t>(src), std::span<bf16_t>(dst));
  }),
                    "the backend cannot reduce bf16 values with avg, which step 1 of the plan "
                    "needs");
  CHECK_NOTHROW(world.run([&](SimulatedBackend& inner) {
    RestrictedBackend b(inner);
    std::vector<float> src(16), dst(8);
    execute(fine, b, std::span<const float>(src), std::span<float>(dst));
  }));
}

TEST_CASE("a plan run on a backend whose mesh differs", "[bad][execute]") {
  const Plan plan =
      plan_redistribute(layout(DeviceMesh({4}), "S(0)", {8}), layout(DeviceMesh({4}), "R", {8}));
  SimulatedWorld world(DeviceMesh({2, 2}));
  CHECK_THROWS_WITH(world.run([&](SimulatedBackend& b) {
    std::vector<float> src(2), dst(8);
    execute(plan, b, std::span<const float>(src), std::span<float>(dst));
  }),
                    "the backend's mesh 2x2 is not the plan's mesh 4");
  // verify_on_simulator on a world of another mesh refuses before any rank runs.
  CHECK_THROWS_WITH(verify_on_simulator(plan, world),
                    "the simulated world's mesh 2x2 is not the plan's mesh 4");
  SimulatedWorld right(DeviceMesh({4}));
  CHECK(verify_on_simulator(plan, right).verified);
  // So does verify_batch_on_simulator.
  const std::vector<Redistribution> tensors{{plan.src(), plan.dst()}, {plan.dst(), plan.src()}};
  const BatchPlan<> batch = plan_batch(std::span<const Redistribution>(tensors));
  CHECK_THROWS_WITH(verify_batch_on_simulator(batch, world),
                    "the simulated world's mesh 2x2 is not the plan's mesh 4");
  CHECK(verify_batch_on_simulator(batch, right).verified);
  CHECK(verify_on_simulator(plan, right).verified);
}

TEMPLATE_TEST_CASE("NaN and Inf in reductions are propagated, not hidden", "[bad][execute]", float,
                   double, bf16_t, f16_t) {
  using T = TestType;
  const DeviceMesh m({2, 2});
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const char* op : {"P(sum)", "P(avg)", "P(max)", "P(min)"}) {
    for (const char* to : {"R,R", "S(0),R"}) {
      INFO(op << " -> " << to);
      const std::string from = std::string(op) + "," + op;
      const Layout src = layout(m, from.c_str(), {4}, dtype_of<T>);
      const Plan plan = plan_redistribute(src, layout(m, to, {4}, dtype_of<T>));
      // Element 0: a NaN in one rank's part. Element 1: +Inf and -Inf in two parts.
      // Element 2: +Inf in one part. Element 3: finite parts, for contrast.
      std::vector<std::vector<T>> parts(4, std::vector<T>(4, detail::narrow<T>(1.0)));
      parts[2][0] = detail::narrow<T>(nan);
      parts[0][1] = detail::narrow<T>(inf);
      parts[3][1] = detail::narrow<T>(-inf);
      parts[1][2] = detail::narrow<T>(inf);
      const auto out = run(plan, parts);
      const bool is_max = std::string(op) == "P(max)", is_min = std::string(op) == "P(min)";
      for (int r = 0; r < 4; ++r) {
        const Box box = plan.dst().local_box(r);
        for (std::int64_t e = 0; e < box.numel(); ++e) {
          const std::int64_t i = box.offset[0] + e;
          const double v =
              double(detail::widen(out[static_cast<std::size_t>(r)][static_cast<std::size_t>(e)]));
          if (i == 0) CHECK(std::isnan(v));  // NaN wins in sum, avg, max and min alike
          if (i == 1) {
            if (is_max)
              CHECK(v == inf);
            else if (is_min)
              CHECK(v == -inf);
            else
              CHECK(std::isnan(v));  // Inf - Inf
          }
          if (i == 2) CHECK(v == (is_min ? 1.0 : inf));
          if (i == 3) CHECK(std::isfinite(v));
        }
      }
    }
  }
}

TEST_CASE("byte counts of huge shapes: checked arithmetic, a clear error", "[bad]") {
  const DeviceMesh m({8});
  // The tensor's own size does not fit.
  CHECK_THROWS_WITH(layout(m, "S(0)", {std::int64_t{1} << 62, 4}),
                    "the tensor's size in bytes overflows 64 bits");
  // The tensor fits (1.5 * 2^62 bytes), but an all-reduce moves 7/4 of it through every rank.
  const Shape bigger{std::int64_t{1} << 31, std::int64_t{3} << 30};
  CHECK_THROWS_WITH(
      plan_redistribute(layout(m, "P", bigger, DType::u8), layout(m, "R", bigger, DType::u8)),
      "the bytes a rank moves in this redistribution overflow 64 bits: the tensor "
      "is too large for byte counts");
  // What fits is counted exactly.
  const Shape huge{std::int64_t{1} << 30, std::int64_t{1} << 30};
  const Plan gather = plan_redistribute(layout(m, "S(0)", huge), layout(m, "R", huge));
  CHECK(gather.bytes_recv_max() == (std::int64_t{1} << 62) / 8 * 7);
  CHECK(gather.lower_bound_bytes_recv_max() == gather.bytes_recv_max());
}

TEST_CASE("the adjoint of a reduction that is not linear", "[bad]") {
  const DeviceMesh m({4});
  CHECK_THROWS_WITH(plan_adjoint(layout(m, "P(max)", {8}), layout(m, "R", {8})),
                    "the adjoint needs R, S(d) or P(sum) placements: P(max) has no dual");
}

TEST_CASE("a failed run leaves every rank's source untouched", "[bad][execute]") {
  const DeviceMesh m({2, 2});
  const Layout from = layout(m, "P,S(1)", {6, 5});
  const Plan plan = plan_redistribute(from, layout(m, "R,S(0)", {6, 5}));
  std::vector<std::vector<float>> sources = global_view_sources<float>(from);
  const auto before = sources;
  // Rank 2's target is one element short: it fails, and the simulated world aborts the others
  // wherever they are.
  CHECK_THROWS_WITH(run(plan, sources, 2), Catch::Matchers::Contains("the target buffer holds") &&
                                               Catch::Matchers::Contains("but rank 2 needs"));
  CHECK(sources == before);
  // And the same plan with whole buffers runs.
  CHECK_NOTHROW(run(plan, sources));
  CHECK(sources == before);
}
