// The global-view oracle: a global tensor filled with its own linear index is cut into every
// rank's source block, the plan runs on the simulated backend, and every rank's result must
// equal the target block cut from the same tensor.
#include <catch2/catch.hpp>

#include <dtensor/backend/simulated.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/verify.hpp>

#include "forwarding_backend.hpp"
#include "packing_backend.hpp"
#include "placement_pairs.hpp"
#include "simulated_worlds.hpp"

#include <unsupported/Eigen/CXX11/Tensor>

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

using namespace dtensor;
using dtensor::testing::world_of;

namespace {

using Global = Eigen::Tensor<double, 2, Eigen::RowMajor>;

// The global tensor [rows, cols] holding its own linear index.
Global linear_index(const Shape& shape) {
  Global g(shape[0], shape[1]);
  for (Eigen::Index i = 0; i < g.dimension(0); ++i)
    for (Eigen::Index j = 0; j < g.dimension(1); ++j) g(i, j) = double(i * g.dimension(1) + j);
  return g;
}

// The block `box` of the global tensor, row-major.
Global cut(const Global& g, const Box& box) {
  const Eigen::array<Eigen::Index, 2> at{box.offset[0], box.offset[1]};
  const Eigen::array<Eigen::Index, 2> size{box.shape[0], box.shape[1]};
  return g.slice(at, size);
}

// Part `c` of `g` parts of x whose reduction with op is x; distinct and mostly non-zero.
// Unsigned types keep the parts non-negative.
double part(double x, ReduceOp op, int c, int g, bool non_negative) {
  if (non_negative && (op == ReduceOp::sum || op == ReduceOp::max)) return c == 0 ? x : 0.0;
  if (non_negative && op == ReduceOp::avg) return x;
  switch (op) {
    // sum: 1, 2, ..., g-1 and the rest; avg: x + 1, ..., x + g-1 and what brings the mean to x.
    case ReduceOp::sum: return c < g - 1 ? double(c + 1) : x - double((g - 1) * g / 2);
    case ReduceOp::avg: return c < g - 1 ? x + double(c + 1) : x - double((g - 1) * g / 2);
    case ReduceOp::max: return c == 0 ? x : x - (c + 1);
    case ReduceOp::min: return c == 0 ? x : x + (c + 1);
    case ReduceOp::product: return c == 0 ? x : 1;
  }
  return x;
}

// The value rank `coord` holds for global value x under `placements`: Partial dims split it,
// the innermost first, since reductions run outermost first.
double held(double x, const Placements& placements, const DeviceMesh& mesh, const MeshCoord& c,
            bool non_negative) {
  for (int k = mesh.ndim(); k-- > 0;)
    if (placements[k].is_partial())
      x = part(x, placements[k].reduce_op(), c[k], mesh.size(k), non_negative);
  return x;
}

template <class T>
T to_elem(double v) {
  return detail::narrow<T>(static_cast<detail::compute_t<T>>(v));
}
template <class T>
double from_elem(T v) {
  return static_cast<double>(detail::widen(v));
}

struct Outcome {
  int wrong = 0;
  int unequal_replicas = 0;
  int bytes_mismatch = 0;
  std::string first;
};

// verify_on_simulator on the plan's mesh's world.
Verification verified_on(const Plan& plan) {
  return verify_on_simulator(plan, world_of(plan.src().mesh()));
}

template <class T>
Outcome run_plan(const Plan& plan) {
  const Layout& src = plan.src();
  const Layout& dst = plan.dst();
  const DeviceMesh& mesh = src.mesh();
  const int n = mesh.size();
  const Global g = linear_index(src.global_shape());
  std::vector<std::vector<T>> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    const MeshCoord c = mesh.coordinate(r);
    const Global block = cut(g, src.local_box(c));
    auto& v = in[static_cast<std::size_t>(r)];
    v.resize(static_cast<std::size_t>(block.size()));
    for (Eigen::Index i = 0; i < block.size(); ++i)
      v[static_cast<std::size_t>(i)] =
          to_elem<T>(held(block.data()[i], src.placements(), mesh, c, std::is_unsigned_v<T>));
    out[static_cast<std::size_t>(r)].assign(static_cast<std::size_t>(dst.local_box(c).numel()),
                                            to_elem<T>(-7));
  }
  const std::vector<std::vector<T>> untouched = in;
  SimulatedWorld& world = world_of(mesh);
  std::vector<ExecuteStats> stats(static_cast<std::size_t>(n));
  world.run([&](SimulatedBackend& b) {
    const auto r = static_cast<std::size_t>(b.rank());
    execute(plan, b, std::span<const T>(in[r]), std::span<T>(out[r]), &stats[r]);
  });
  Outcome o;
  // Every rank holds exactly the scratch the executor plans for it on this backend, within
  // workspace_bytes for the backend and for any backend.
  const std::int64_t predicted = workspace_bytes<SimulatedBackend>(plan);
  for (int r = 0; r < n; ++r) {
    const std::int64_t held = stats[static_cast<std::size_t>(r)].scratch_peak_bytes;
    const std::int64_t planned = detail::rank_workspace_bytes(
        plan, mesh.coordinate(r), 0, detail::abilities_of<detail::Link<SimulatedBackend>>);
    if (held != planned || held > predicted || predicted > workspace_bytes(plan)) {
      ++o.wrong;
      if (o.first.empty())
        o.first = fmt::format(
            "rank {} held {} scratch bytes, planned {}, workspace_bytes {} (any backend {})", r,
            held, planned, predicted, workspace_bytes(plan));
    }
  }
  auto note = [&](std::string what) {
    if (o.first.empty()) o.first = std::move(what);
  };
  const bool floating = is_floating(src.dtype());
  const double tolerance = src.dtype() == DType::bf16 ? 1e-2 : floating ? 1e-5 : 0;
  for (int r = 0; r < n; ++r) {
    if (in[static_cast<std::size_t>(r)] != untouched[static_cast<std::size_t>(r)]) {
      ++o.wrong;
      note(fmt::format("rank {} source buffer written", r));
    }
    const RankBytes measured = world.bytes(r), planned = rank_bytes(plan, r);
    if (!(measured == planned)) {
      ++o.bytes_mismatch;
      note(fmt::format("rank {} moved {}/{} bytes, planned {}/{}", r, measured.send, measured.recv,
                       planned.send, planned.recv));
    }
  }
  // Each group of ranks that differ only on the target's Partial dims: reduce their results
  // (outermost Partial dim first) and compare with the target block.
  bool fixed[max_mesh_dims] = {};
  for (int k = 0; k < mesh.ndim(); ++k) fixed[k] = !dst.placement(k).is_partial();
  for (int r = 0; r < n; ++r) {
    MeshCoord c = mesh.coordinate(r);
    bool leader = true;
    for (int k = 0; k < mesh.ndim(); ++k) leader = leader && (fixed[k] || c[k] == 0);
    if (!leader) continue;
    const Box box = dst.local_box(c);
    const Global want = cut(g, box);
    std::vector<double> value(static_cast<std::size_t>(box.numel()));
    for (std::size_t e = 0; e < value.size(); ++e)
      value[e] = from_elem(out[static_cast<std::size_t>(r)][e]);
    // Fold each Partial dim, outermost first: value(rest) = op over that dim of parts.
    std::vector<MeshCoord> members{c};
    for (int k = 0; k < mesh.ndim(); ++k) {
      if (fixed[k]) continue;
      std::vector<MeshCoord> next;
      for (const MeshCoord& m : members)
        for (int j = 0; j < mesh.size(k); ++j) {
          MeshCoord x = m;
          x[k] = j;
          next.push_back(x);
        }
      members = next;
    }
    if (members.size() > 1) {
      // Reduce in the order the data was split: innermost last.
      std::vector<std::vector<double>> vals;
      for (const MeshCoord& m : members) {
        std::vector<double> v(value.size());
        for (std::size_t e = 0; e < v.size(); ++e)
          v[e] = from_elem(out[static_cast<std::size_t>(mesh.rank(m))][e]);
        vals.push_back(v);
      }
      // members enumerate the Partial dims in mesh order, last dim fastest.
      int stride = static_cast<int>(members.size());
      for (int k = 0; k < mesh.ndim(); ++k) {
        if (fixed[k]) continue;
        const int gk = mesh.size(k);
        stride /= gk;
        const ReduceOp op = dst.placement(k).reduce_op();
        std::vector<std::vector<double>> reduced;
        for (int blockstart = 0; blockstart < static_cast<int>(vals.size());
             blockstart += gk * stride)
          for (int s = 0; s < stride; ++s) {
            std::vector<double> acc = vals[static_cast<std::size_t>(blockstart + s)];
            for (int j = 1; j < gk; ++j)
              for (std::size_t e = 0; e < acc.size(); ++e)
                acc[e] = detail::combine(
                    acc[e], vals[static_cast<std::size_t>(blockstart + j * stride + s)][e], op);
            if (op == ReduceOp::avg)
              for (double& a : acc) a /= gk;
            reduced.push_back(acc);
          }
        vals = reduced;
      }
      value = vals[0];
    }
    for (std::size_t e = 0; e < value.size(); ++e) {
      const double expect = want.data()[e];
      if (std::abs(value[e] - expect) > tolerance * std::max(1.0, std::abs(expect))) {
        ++o.wrong;
        note(fmt::format("rank {} element {}: {} instead of {}", r, e, value[e], expect));
        break;
      }
    }
  }
  // Replicas (ranks with the same target block and no Partial target) are bit-identical.
  if (!has_partial(dst.placements())) {
    for (int r = 0; r < n; ++r)
      for (int q = r + 1; q < n; ++q)
        if (dst.local_box(r) == dst.local_box(q) && !out[static_cast<std::size_t>(r)].empty() &&
            std::memcmp(out[static_cast<std::size_t>(r)].data(),
                        out[static_cast<std::size_t>(q)].data(),
                        out[static_cast<std::size_t>(r)].size() * sizeof(T)) != 0) {
          ++o.unequal_replicas;
          note(fmt::format("replicas {} and {} differ", r, q));
        }
  }
  return o;
}

// Counts runs and failures, reporting the first few failures with their case.
struct Tally {
  int runs = 0, failures = 0;
  void add(const Outcome& o, const std::string& what) {
    ++runs;
    if (!o.wrong && !o.unequal_replicas && !o.bytes_mismatch) return;
    if (++failures <= 10) FAIL_CHECK(what + ": " + o.first);
  }
};

template <class T>
Outcome run_case(const Layout& src, const Layout& dst, const PlanOptions& options = {}) {
  return run_plan<T>(plan_redistribute(src, dst, options));
}

Outcome run_case(DType dtype, const Layout& src, const Layout& dst, const PlanOptions& options) {
  return detail::visit_dtype(dtype, [&]<class T>() { return run_case<T>(src, dst, options); });
}

}  // namespace

TEST_CASE("the global view: every pair of the planner's matrix, executed", "[execute][oracle]") {
  const Placement options[] = {Replicate(), Shard(0), Shard(1), Partial(), Partial(ReduceOp::max)};
  const DeviceMesh meshes[] = {DeviceMesh({4}), DeviceMesh({2, 2}), DeviceMesh({2, 4}),
                               DeviceMesh({2, 2, 2})};
  const Shape shapes[] = {{16, 8}, {5, 7}};
  Tally tally;
  for (const DeviceMesh& m : meshes) {
    testing::for_each_pair(m, options, [&](int x, int y, const Placements& a, const Placements& b) {
      for (const Shape& shape : shapes) {
        // f32 everywhere; i64 and bf16 on the smaller meshes and a sample of the others.
        std::vector<DType> dtypes{DType::f32};
        if (m.size() <= 4 || (x + y) % 7 == 0) {
          dtypes.push_back(DType::i64);
          dtypes.push_back(DType::bf16);
        }
        // Every shape also runs with bounded memory; uneven shapes padded, exact, and under the
        // bytes objective too.
        std::vector<PlanOptions> variants{{}, PlanOptions{.memory = Memory::bounded}};
        if (shape[0] == 5)
          variants.insert(variants.end(), {PlanOptions{.padding = Padding::always},
                                           PlanOptions{.padding = Padding::never},
                                           PlanOptions{.objective = Objective::bytes}});
        for (DType dtype : dtypes)
          for (const PlanOptions& variant : variants) {
            if (dtype != DType::f32 &&
                (variant.padding != Padding::automatic || variant.memory != Memory::any))
              continue;
            const Layout src(m, a, shape, dtype), dst(m, b, shape, dtype);
            tally.add(run_case(dtype, src, dst, variant),
                      fmt::format("{} {} {} {} -> {}", m, shape, dtype, a, b));
          }
      }
    });
  }
  fmt::print("global-view oracle: {} runs, {} failed\n", tally.runs, tally.failures);
  CHECK(tally.failures == 0);
}

TEST_CASE("an exchange from a Partial, on every pair it applies to",
          "[execute][oracle][exchange]") {
  // The one-step plan, whatever the planner would choose: every reduced op, even and uneven
  // shapes.
  const Placement options[] = {
      Replicate(), Shard(0), Shard(1), Partial(), Partial(ReduceOp::max), Partial(ReduceOp::avg)};
  const DeviceMesh meshes[] = {DeviceMesh({4}), DeviceMesh({2, 2}), DeviceMesh({2, 4}),
                               DeviceMesh({2, 2, 2})};
  Tally tally;
  int fewer = 0;
  for (const DeviceMesh& m : meshes)
    testing::for_each_pair(m, options, [&](int, int, const Placements& a, const Placements& b) {
      if (!detail::exchange_reduces(a, b)) return;
      for (const Shape& shape : {Shape{16, 8}, Shape{5, 7}})
        for (DType dtype : {DType::f32, DType::i64, DType::bf16}) {
          // Integer and bf16 reductions on the smaller meshes.
          if (!testing::placements_fit(a, dtype) || (dtype != DType::f32 && m.size() > 4)) continue;
          const Layout src(m, a, shape, dtype), dst(m, b, shape, dtype);
          const Placements end = b;
          const Plan plan = detail::plan_builder::build(
              src, dst, {}, &end, {}, PlanOptions{}.with_cost_model(CostModel::defaults(m)));
          REQUIRE(plan.size() == 1);
          const Outcome o =
              detail::visit_dtype(dtype, [&]<class T>() { return run_plan<T>(plan); });
          tally.add(o, fmt::format("{} {} {} {} -> {}", m, shape, dtype, a, b));
          if (dtype == DType::f32 &&
              plan.bytes_recv_max() <
                  plan_redistribute(src, dst, {.allow_exchange = false}).bytes_recv_max())
            ++fewer;
        }
    });
  fmt::print("exchange from a Partial: {} runs, {} failed; fewer bytes than collectives in {}\n",
             tally.runs, tally.failures, fewer);
  CHECK(tally.runs * testing::exhaustive_stride() > 5000);  // 7,428 of every pair
  CHECK(fewer > 0);
  CHECK(tally.failures == 0);
}

TEST_CASE("the global view in every dtype", "[execute][oracle][dtypes]") {
  const Placement options[] = {Replicate(),
                               Shard(0),
                               Shard(1),
                               Partial(),
                               Partial(ReduceOp::max),
                               Partial(ReduceOp::avg),
                               Partial(ReduceOp::min)};
  Tally tally;
  for (const DeviceMesh& m : {DeviceMesh({4}), DeviceMesh({2, 2})})
    testing::for_each_pair(m, options, [&](int, int, const Placements& a, const Placements& b) {
      for (const Shape& shape : {Shape{8, 8}, Shape{5, 7}})
        for (DType dtype : all_dtypes) {
          if (!testing::placements_fit(a, dtype) || !testing::placements_fit(b, dtype)) continue;
          tally.add(run_case(dtype, Layout(m, a, shape, dtype), Layout(m, b, shape, dtype), {}),
                    fmt::format("{} {} {} {} -> {}", m, shape, dtype, a, b));
        }
    });
  fmt::print("global-view oracle, every dtype: {} runs, {} failed\n", tally.runs, tally.failures);
  CHECK(tally.failures == 0);
}

namespace {

// A deterministic pseudo-random value in [-1, 1) for (element, key).
double noise(std::uint64_t element, std::uint64_t key) {
  std::uint64_t z =
      element * 0x9E3779B97F4A7C15ull + key * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) / double(1ull << 52) - 1.0;
}

// Every rank's block of a tensor in `layout`, with values that depend on the element and on
// the rank's coordinates on the mesh dims listed in `distinct` (the others replicate).
std::vector<std::vector<double>> random_blocks(const Layout& layout, const bool* distinct,
                                               std::uint64_t seed) {
  const DeviceMesh& mesh = layout.mesh();
  std::vector<std::vector<double>> out(static_cast<std::size_t>(mesh.size()));
  for (int r = 0; r < mesh.size(); ++r) {
    const MeshCoord c = mesh.coordinate(r);
    std::uint64_t key = seed;
    for (int k = 0; k < mesh.ndim(); ++k)
      key = key * 131 + (distinct[k] ? std::uint64_t(c[k]) + 1 : 0);
    const Box b = layout.local_box(c);
    auto& v = out[static_cast<std::size_t>(r)];
    v.resize(static_cast<std::size_t>(b.numel()));
    for (std::int64_t i = 0; i < b.shape[0]; ++i)
      for (std::int64_t j = 0; j < b.shape[1]; ++j) {
        const auto e =
            std::uint64_t((b.offset[0] + i) * layout.global_shape()[1] + b.offset[1] + j);
        v[static_cast<std::size_t>(i * b.shape[1] + j)] = noise(e, key);
      }
  }
  return out;
}

std::vector<std::vector<double>> run_plan(const Plan& plan,
                                          const std::vector<std::vector<double>>& in) {
  const DeviceMesh& mesh = plan.src().mesh();
  std::vector<std::vector<double>> out(static_cast<std::size_t>(mesh.size()));
  for (int r = 0; r < mesh.size(); ++r)
    out[static_cast<std::size_t>(r)].resize(
        static_cast<std::size_t>(plan.dst().local_box(r).numel()));
  SimulatedWorld& world = world_of(mesh);
  world.run([&](SimulatedBackend& b) {
    const auto r = static_cast<std::size_t>(b.rank());
    execute(plan, b, std::span<const double>(in[r]), std::span<double>(out[r]));
  });
  return out;
}

double dot(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double s = 0;
  for (std::size_t r = 0; r < a.size(); ++r)
    for (std::size_t e = 0; e < a[r].size(); ++e) s += a[r][e] * b[r][e];
  return s;
}

}  // namespace

TEST_CASE("adjoint plans are transposes: <A x, y> = <x, A^T y>", "[execute][adjoint]") {
  const Placement sources[] = {Replicate(), Shard(0), Shard(1)};
  const Placement targets[] = {Replicate(), Shard(0), Shard(1), Partial()};
  const DeviceMesh meshes[] = {DeviceMesh({4}), DeviceMesh({2, 2}), DeviceMesh({2, 4}),
                               DeviceMesh({2, 2, 2})};
  const Shape shapes[] = {{16, 8}, {5, 7}};
  int runs = 0, failures = 0;
  for (const DeviceMesh& m : meshes) {
    int xs = 1, ys = 1;
    for (int k = 0; k < m.ndim(); ++k) xs *= 3, ys *= 4;
    for (int x = 0; x < xs; ++x)
      for (int y = 0; y < ys; ++y)
        for (const Shape& shape : shapes) {
          if ((x * ys + y) % testing::exhaustive_stride() != 0) continue;
          Placements a, b;
          for (int k = 0, rx = x, ry = y; k < m.ndim(); ++k, rx /= 3, ry /= 4) {
            a.push_back(sources[rx % 3]);
            b.push_back(targets[ry % 4]);
          }
          const Layout src(m, a, shape, DType::f64), dst(m, b, shape, DType::f64);
          const Plan forward = plan_redistribute(src, dst);
          const Plan transpose = adjoint(forward);
          // x: a tensor in the source layout (replicas equal); y: a tensor in dual(target),
          // where the target's Replicate dims are Partial (any values per rank).
          bool x_distinct[max_mesh_dims] = {}, y_distinct[max_mesh_dims] = {};
          for (int k = 0; k < m.ndim(); ++k) {
            x_distinct[k] = a[k].is_shard();
            y_distinct[k] = b[k].is_shard() || b[k].is_replicate();
          }
          const auto xv = random_blocks(src, x_distinct, 1);
          const auto yv = random_blocks(dst, y_distinct, 2);
          const double lhs = dot(run_plan(forward, xv), yv);
          const double rhs = dot(xv, run_plan(transpose, yv));
          ++runs;
          if (std::abs(lhs - rhs) > 1e-9 * std::max(1.0, std::abs(lhs))) {
            ++failures;
            if (failures <= 5)
              FAIL_CHECK(fmt::format("{} {} {} -> {}: <Ax,y> = {} but <x,A^T y> = {}", m, shape, a,
                                     b, lhs, rhs));
          }
        }
  }
  fmt::print("adjoint dot-product test: {} pairs, {} failed\n", runs, failures);
  CHECK(failures == 0);
}

namespace {

using testing::PackingBackend;
static_assert(StridedAllToAll<SimulatedBackend> && StridedAllGather<SimulatedBackend>);
static_assert(Backend<PackingBackend> && !StridedAllToAll<PackingBackend> &&
              !StridedAllGather<PackingBackend>);

// One run of a plan on the simulator, with the global view as every rank's source.
struct SimulatedRun {
  std::vector<std::vector<std::byte>> results;  // per mesh index
  std::vector<RankBytes> measured;
  std::vector<std::int64_t> scratch_peak;
  std::int64_t collectives = 0;  // collective calls per group and point-to-point rounds
};

template <class T>
SimulatedRun run_simulated(const Plan& plan, bool packing) {
  const DeviceMesh& mesh = plan.src().mesh();
  const auto n = static_cast<std::size_t>(mesh.size());
  std::vector<std::vector<T>> in(n), out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int rank = mesh.rank_at(static_cast<int>(i));
    in[i] = global_view_block<T>(plan.src(), rank);
    out[i].assign(static_cast<std::size_t>(plan.dst().local_numel(rank)), T{});
  }
  SimulatedRun run;
  run.scratch_peak.resize(n);
  SimulatedWorld& world = world_of(mesh);
  world.run([&](SimulatedBackend& b) {
    const auto i = static_cast<std::size_t>(mesh.index_of(b.rank()));
    ExecuteStats stats;
    if (packing) {
      PackingBackend p(b);
      execute(plan, p, std::span<const T>(in[i]), std::span<T>(out[i]), &stats);
    } else {
      execute(plan, b, std::span<const T>(in[i]), std::span<T>(out[i]), &stats);
    }
    run.scratch_peak[i] = stats.scratch_peak_bytes;
  });
  for (std::size_t i = 0; i < n; ++i) {
    const auto* bytes = reinterpret_cast<const std::byte*>(out[i].data());
    run.results.emplace_back(bytes, bytes + out[i].size() * sizeof(T));
    run.measured.push_back(world.bytes(mesh.rank_at(static_cast<int>(i))));
  }
  run.collectives = world.collectives();
  return run;
}

// `plan` run with strided calls and packing, checked for what must agree: the same bits, every
// rank's bytes measured equal to those planned, and each run's scratch exactly what the
// executor plans for its backend.
std::pair<SimulatedRun, SimulatedRun> run_strided_and_packed(const Plan& plan) {
  auto runs = detail::visit_dtype(plan.src().dtype(), [&]<class T>() {
    return std::pair{run_simulated<T>(plan, false), run_simulated<T>(plan, true)};
  });
  const auto& [strided, packed] = runs;
  CHECK(strided.results == packed.results);
  const DeviceMesh& mesh = plan.src().mesh();
  for (int i = 0; i < mesh.size(); ++i) {
    const auto u = static_cast<std::size_t>(i);
    CHECK(strided.measured[u] == rank_bytes(plan, mesh.rank_at(i)));
    CHECK(packed.measured[u] == strided.measured[u]);
    const MeshCoord at = mesh.coordinate(mesh.rank_at(i));
    CHECK(strided.scratch_peak[u] ==
          detail::rank_workspace_bytes(plan, at, 0,
                                       detail::abilities_of<detail::Link<SimulatedBackend>>));
    CHECK(packed.scratch_peak[u] ==
          detail::rank_workspace_bytes(plan, at, 0,
                                       detail::abilities_of<detail::Link<PackingBackend>>));
  }
  return runs;
}

// Every rank of `run` (a run of a plan from `src` to `dst`) held no more scratch than the larger
// of its source and target blocks.
void check_within_ends(const SimulatedRun& run, const Layout& src, const Layout& dst) {
  const DeviceMesh& mesh = src.mesh();
  for (int i = 0; i < mesh.size(); ++i) {
    const int rank = mesh.rank_at(i);
    CHECK(run.scratch_peak[static_cast<std::size_t>(i)] <=
          std::max(src.local_bytes(rank), dst.local_bytes(rank)));
  }
}

}  // namespace

TEST_CASE("pieces sent and received strided, without packing", "[execute][strided]") {
  // `strided`: an all-to-all's send pieces are not slabs of the block, or its receive pieces
  // not slabs of the target, or an all-gather's pieces not slabs of the target, so a
  // StridedAllToAll or StridedAllGather backend moves them where they lie and the run holds
  // less scratch than one that packs and unpacks them.
  struct Case {
    std::string_view mesh, from, to;
    Shape shape;
    bool strided;
  };
  const Case cases[] = {{"4", "S(0)", "S(1)", {8, 12}, true},
                        {"4", "S(1)", "S(0)", {8, 12}, true},  // received strided
                        {"8", "S(0)", "S(1)", {16, 32}, true},
                        {"8", "S(1)", "S(0)", {16, 32}, true},
                        {"4", "S(0)", "S(2)", {8, 3, 8}, true},
                        {"4", "S(2)", "S(1)", {4, 8, 8}, true},
                        {"4", "S(1)", "S(2)", {4, 8, 8}, true},
                        {"2x4", "R,S(0)", "R,S(1)", {8, 16}, true},
                        {"4", "S(1)", "R", {8, 12}, true},  // all-gathered strided
                        {"2x4", "R,S(1)", "R,R", {8, 16}, true},
                        {"4", "S(0)", "R", {8, 12}, false},  // slabs both ways
                        {"2x2", "S(0),S(1)", "S(1),S(0)", {8, 8}, false}};
  for (const Case& c : cases)
    for (DType dtype : {DType::f32, DType::bf16}) {
      const DeviceMesh mesh = parse_mesh(c.mesh);
      const Layout src(mesh, parse_placements(c.from), c.shape, dtype);
      const Layout dst(mesh, parse_placements(c.to), c.shape, dtype);
      const Plan plan = plan_redistribute(src, dst);
      INFO(fmt::format("{}: {} -> {} {} {}", c.mesh, c.from, c.to, c.shape, dtype));
      if (c.strided)
        REQUIRE((plan.size() == 1 &&
                 (plan[0].kind == StepKind::all_to_all || plan[0].kind == StepKind::all_gather)));
      // Values against the global view, bytes measured against bytes planned, the source
      // untouched: the strided path.
      const Verification v = verified_on(plan);
      CHECK(v.verified);
      CHECK(v.difference == "");
      // The same bits and bytes as packing first; less scratch where the pieces are strided.
      const auto [strided, packed] = run_strided_and_packed(plan);
      CHECK(strided.results == v.results);
      for (std::size_t u = 0; u < strided.scratch_peak.size(); ++u) {
        if (c.strided)
          CHECK(strided.scratch_peak[u] < packed.scratch_peak[u]);
        else
          CHECK(strided.scratch_peak[u] == packed.scratch_peak[u]);
      }
      // One step between row slabs and column pieces, or gathering columns: no scratch at all.
      if (c.strided && c.shape.size() == 2 && mesh.ndim() == 1)
        for (std::int64_t peak : strided.scratch_peak) CHECK(peak == 0);
    }
}

TEST_CASE("point-to-point rounds move strided pieces where they lie", "[execute][strided]") {
  // Exact steps and exchanges whose pieces are not contiguous runs (column pieces), and an even
  // reduce-scatter into column pieces: a StridedExchange backend sends and receives them as
  // runs of one stride, one that is not packs and stages them. Same bits, same bytes, exactly
  // the planned scratch on each, and less of it where the pieces are strided.
  static_assert(StridedExchange<SimulatedBackend> && !StridedExchange<PackingBackend>);
  struct Case {
    std::string_view mesh, from, to;
    Shape shape;
    Memory memory;
  };
  const Case cases[] = {{"4", "P", "S(1)", {8, 12}, Memory::any},           // even, into columns
                        {"2x2", "P,R", "S(1),R", {8, 12}, Memory::any},     // the same per group
                        {"4", "P", "S(1)", {7, 10}, Memory::bounded},       // exact
                        {"4", "S(1)", "R", {7, 10}, Memory::bounded},       // exact gather
                        {"4", "S(0)", "S(1)", {7, 10}, Memory::bounded},    // exact all-to-all
                        {"2x4", "S(1),R", "R,S(1)", {8, 16}, Memory::any},  // exchange
                        {"2x2", "P,S(0)", "S(1),S(0)", {8, 12}, Memory::any},
                        {"2", "P", "S(1)", {7, 9}, Memory::bounded},  // exact, own partial in place
                        {"2x2", "S(0),P", "S(1),S(1)", {8, 16}, Memory::bounded},
                        // reduce-scatters of 4 members in 3 rounds (reduces_in_rounds)
                        {"2x4", "S(0),P", "S(1),S(1)", {8, 16}, Memory::bounded},
                        {"2x4", "S(1),P(max)", "S(0),S(1)", {8, 16}, Memory::bounded},
                        {"4", "P", "S(1)", {8, 16}, Memory::bounded}};  // from the source: one
  for (const Case& c : cases)
    for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
      const DeviceMesh mesh = parse_mesh(c.mesh);
      const Layout src(mesh, parse_placements(c.from), c.shape, dtype);
      const Layout dst(mesh, parse_placements(c.to), c.shape, dtype);
      const Plan plan = plan_redistribute(src, dst, {.memory = c.memory});
      INFO(fmt::format("{}: {} -> {} {} {}: {}", c.mesh, c.from, c.to, c.shape, dtype, plan));
      const Verification v = verified_on(plan);
      CHECK(v.verified);
      CHECK(v.difference == "");
      const auto [strided, packed] = run_strided_and_packed(plan);
      const std::int64_t strided_most =
          *std::max_element(strided.scratch_peak.begin(), strided.scratch_peak.end());
      const std::int64_t packed_most =
          *std::max_element(packed.scratch_peak.begin(), packed.scratch_peak.end());
      // Except where a backend that packs packs one piece per round (packs_in_rounds) while
      // one that sends strided pieces keeps one round from the caller's source: as much there.
      // And where a pair's reduce-scatter packs its column pieces in its block
      // (ScatterWay::pack_in_block) after an all-to-all into scratch: as much there too.
      if ((c.mesh == "4" && c.from == "P" && c.shape == Shape{7, 10} &&
           c.memory == Memory::bounded && dtype != DType::bf16) ||
          (c.mesh == "2x2" && c.from == "S(0),P" && c.memory == Memory::bounded))
        CHECK(strided_most == packed_most);
      else
        CHECK(strided_most < packed_most);
      CHECK(strided_most == workspace_bytes<SimulatedBackend>(plan));
      // An exact reduction over a pair reads its own partial where it lies and receives the
      // other's into the target: the reduce-scatter stages nothing, and the a2a before it holds
      // only its block (both ends' size).
      if (c.mesh == "2") CHECK(strided_most == 0);
      if (c.mesh == "2x2" && c.from == "S(0),P") CHECK(strided_most <= src.max_local_bytes());
      // In rounds, each partial received into the target or a slot of the block already sent:
      // nothing beyond the block, which is within the source's size.
      if (c.mesh == "2x4" && c.memory == Memory::bounded) {
        CHECK(strided_most <= src.max_local_bytes());
        CHECK(strided.collectives == 4 + 3);  // an all-to-all in 4 groups, then 3 rounds
      }
      // From the caller's source, which no round may write, rounds would stage what one round
      // does (2 partials of 8x4, within the 8x16 source): one round.
      if (c.mesh == "4" && c.shape == Shape{8, 16}) {
        CHECK(strided.collectives == 1);
        CHECK(strided_most <= src.max_local_bytes());
      }
    }
  // Dim 0 cut 2 and 1: the reduce-scatter's pieces are slabs on some ranks and not on others,
  // and every rank still takes the same round (found by the fuzzer).
  const DeviceMesh mesh({2, 2});
  const Plan mixed = plan_redistribute(
      Layout(mesh, parse_placements("P(product),S(0)"), {3, 10, 2, 2}, DType::i64),
      Layout(mesh, parse_placements("S(0),R"), {3, 10, 2, 2}, DType::i64),
      {.objective = Objective::bytes});
  INFO(explain(mixed));
  const Verification v = verified_on(mixed);
  CHECK(v.verified);
  CHECK(v.difference == "");
}

namespace {

using MessageScatterBackend = testing::MessageReducingBackend<SimulatedBackend>;

// The threshold the backends of run_scattering_by_messages get (their type's default unless a
// test sets it).
std::size_t reduce_by_messages_from = MessageScatterBackend::reduce_messages_bytes;

template <class T, bool async>
void run_scattering_by_messages(const Plan& plan, std::vector<std::vector<T>>& in,
                                std::vector<std::vector<T>>& out,
                                std::vector<RankBytes>& measured) {
  const DeviceMesh& mesh = plan.src().mesh();
  SimulatedWorld& world = world_of(mesh);
  world.run([&](SimulatedBackend& b) {
    const auto i = static_cast<std::size_t>(mesh.index_of(b.rank()));
    MessageScatterBackend m(b, reduce_by_messages_from);
    if constexpr (async) {  // counts both rounds of an all-reduce by messages as operations
      execute_async(plan, m, in[i].data(), in[i].size() * sizeof(T), out[i].data(),
                    out[i].size() * sizeof(T))
          .wait();
    } else {
      ExecuteStats stats;
      execute(plan, m, std::span<const T>(in[i]), std::span<T>(out[i]), &stats);
      CHECK(stats.scratch_peak_bytes == workspace_bytes(plan, m, b.rank()));
      if (m.from == MessageScatterBackend::reduce_messages_bytes)
        CHECK(stats.scratch_peak_bytes == workspace_bytes<MessageScatterBackend>(plan, b.rank()));
    }
  });
  for (int i = 0; i < mesh.size(); ++i) measured.push_back(world.bytes(mesh.rank_at(i)));
}

}  // namespace

TEST_CASE("a backend's large reductions run as point-to-point rounds", "[execute][strided]") {
  // Every pair of the matrix on 4, 2x2 and 2x4 whose plan reduce-scatters or all-reduces: the
  // global view, the bytes planned and the scratch planned, with even blocks of 256 bytes and up
  // reduced by messages (padded steps and smaller blocks keep the collective), synchronously
  // and through execute_async.
  const Placement options[] = {Replicate(), Shard(0), Shard(1), Partial(), Partial(ReduceOp::max)};
  const DeviceMesh meshes[] = {DeviceMesh({4}), DeviceMesh({2, 2}), DeviceMesh({2, 4})};
  int runs = 0, by_messages = 0;
  // Under Memory::bounded the reduce-scatters of 4 members run in 3 rounds (reduces_in_rounds).
  for (const DeviceMesh& m : meshes)
    testing::for_each_pair(m, options, [&](int, int, const Placements& a, const Placements& b) {
      for (const Shape& shape : {Shape{16, 8}, Shape{8, 32}, Shape{5, 7}})
        for (const Memory memory : {Memory::any, Memory::bounded}) {
          const Plan plan = plan_redistribute(Layout(m, a, shape, DType::f32),
                                              Layout(m, b, shape, DType::f32), {.memory = memory});
          bool reduces = false;
          for (const Step& step : plan)
            reduces = reduces || step.kind == StepKind::reduce_scatter ||
                      step.kind == StepKind::all_reduce;
          if (!reduces) continue;
          MessageScatterBackend::calls = 0;
          const Verification v =
              detail::verify_typed<float>(plan, &run_scattering_by_messages<float, false>);
          INFO(fmt::format("{} {} {} -> {}: {}", m, shape, a, b, v.difference));
          CHECK(v.verified);
          const Verification va =
              detail::verify_typed<float>(plan, &run_scattering_by_messages<float, true>);
          CHECK(va.verified);
          CHECK(va.results == v.results);
          ++runs;
          if (MessageScatterBackend::calls == 0) ++by_messages;
        }
    });
  CHECK(by_messages > 100);
  WARN(fmt::format("{} plans with a reduce-scatter or an all-reduce, {} with every one by messages",
                   runs, by_messages));
}

TEST_CASE("a backend instance sets its own threshold for reductions by messages", "[execute]") {
  // The same plans on backends of one type whose instances reduce by messages from 0 bytes (every
  // even reduction, empty blocks included) or never: the global view, bytes and scratch as
  // planned for that instance (workspace_bytes(plan, backend)), and the collectives called
  // only where the instance says so.
  struct Case {
    const char* mesh;
    Shape shape;
    const char* from;
    const char* to;
  };
  const Case cases[] = {{"4", {16, 8}, "P", "R"},          {"4", {16, 8}, "P", "S(0)"},
                        {"4", {3, 2}, "P(max)", "R"},      {"2x2", {8, 8}, "P,P", "R,S(1)"},
                        {"2x4", {16, 8}, "P,S(0)", "R,R"}, {"2x4", {2, 3}, "S(0),P", "R,R"}};
  for (const Case& k : cases) {
    const DeviceMesh mesh = parse_mesh(k.mesh);
    const Plan plan = plan_redistribute(Layout(mesh, parse_placements(k.from), k.shape),
                                        Layout(mesh, parse_placements(k.to), k.shape));
    INFO(fmt::format("{} {} {} -> {}", k.mesh, k.shape, k.from, k.to));
    int collectives[2] = {};
    for (int never = 0; never < 2; ++never) {
      reduce_by_messages_from = never != 0 ? std::numeric_limits<std::size_t>::max() : 0;
      MessageScatterBackend::calls = 0;
      for (const bool async : {false, true}) {
        const Verification v =
            detail::verify_typed<float>(plan, async ? &run_scattering_by_messages<float, true>
                                                    : &run_scattering_by_messages<float, false>);
        CHECK(v.verified);
      }
      collectives[never] = MessageScatterBackend::calls;
      SimulatedWorld& world = world_of(mesh);
      world.run([&](SimulatedBackend& b) {
        if (b.rank() != 0) return;
        // The busiest rank's figure for this instance, no less than this rank's (each checked
        // as planned in the runs above). Neither instance bounds the other: by messages an
        // all-reduce stages what its two rounds need where the collective runs in place, and a
        // reduce-scatter folds its own partial through the other members' packed pieces where
        // the collective packs its whole block.
        const MessageScatterBackend m(b, reduce_by_messages_from);
        CHECK(workspace_bytes(plan, m) >= workspace_bytes(plan, m, b.rank()));
      });
    }
    CHECK(collectives[0] == 0);  // every reduction by messages
    CHECK(collectives[1] > 0);   // each one a collective
  }
  reduce_by_messages_from = MessageScatterBackend::reduce_messages_bytes;
}

TEST_CASE("runs of one stride: where a box lies in a row-major block", "[execute][strided]") {
  const auto box = [](Shape offset, Shape shape) {
    return Box{std::move(offset), std::move(shape)};
  };
  const Box block = box({0, 0, 0}, {4, 6, 8});
  // Column pieces: 4 * 6 rows of 2 elements, a row of the block apart.
  auto r = detail::runs_of(box({0, 0, 2}, {4, 6, 2}), block, 4);
  REQUIRE(r.has_value());
  CHECK(r->offset == 8);
  CHECK(r->runs.rows == 24);
  CHECK(r->runs.run_bytes == 8);
  CHECK(r->runs.stride_bytes == 32);
  // A slab: one run.
  r = detail::runs_of(box({1, 0, 0}, {2, 6, 8}), block, 4);
  REQUIRE(r.has_value());
  CHECK(r->offset == 192);
  CHECK(r->runs.rows == 1);
  CHECK(r->runs.run_bytes == 384);
  // Rows of dim 1 inside one index of dim 0: 3 runs of a row each... of 8 elements, contiguous.
  r = detail::runs_of(box({2, 1, 0}, {1, 3, 8}), block, 4);
  REQUIRE(r.has_value());
  CHECK(r->runs.rows == 1);
  CHECK(r->runs.run_bytes == 96);
  // Two dims cut short: rows are not one stride apart.
  CHECK_FALSE(detail::runs_of(box({0, 1, 0}, {2, 3, 4}), block, 4).has_value());
  // Dims of extent 1 in the block do not break the stride.
  r = detail::runs_of(box({0, 0, 0}, {4, 1, 3}), box({0, 0, 0}, {4, 1, 6}), 2);
  REQUIRE(r.has_value());
  CHECK(r->runs.rows == 4);
  CHECK(r->runs.run_bytes == 6);
  CHECK(r->runs.stride_bytes == 12);
}

TEST_CASE("whether a step is even is decided without visiting the ranks", "[execute]") {
  // step_is_even follows the sizes the nested shards cut; here against every rank's block, on
  // meshes of 1 to 3 dims of extents 1 to 5, shapes with empty and uneven pieces, both chunk
  // policies and every padding choice.
  std::mt19937 rng(7);
  const char* placements[] = {"R", "S(0)", "S(1)", "P"};
  int steps = 0;
  for (int it = 0; it < 400; ++it) {
    MeshShape extents;
    std::string from, to;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k) {
      extents.push_back(1 + static_cast<int>(rng() % 5));
      from += std::string(k ? "," : "") + placements[rng() % 4];
      to += std::string(k ? "," : "") + placements[rng() % 4];
    }
    const DeviceMesh mesh(extents);
    const Shape shape{static_cast<std::int64_t>(rng() % 23),
                      1 + static_cast<std::int64_t>(rng() % 17)};
    for (ChunkPolicy policy : {ChunkPolicy::torch_chunk, ChunkPolicy::balanced})
      for (Padding padding : {Padding::automatic, Padding::always, Padding::never}) {
        const Layout src(mesh, parse_placements(from), shape, DType::f32, policy);
        const Layout dst(mesh, parse_placements(to), shape, DType::f32, policy);
        const Plan plan = plan_redistribute(src, dst, PlanOptions{.padding = padding});
        for (const Step& s : plan) {
          bool even = true;
          const int k = s.mesh_dim;
          for (int r = 0; r < mesh.size() && k >= 0; ++r) {
            const MeshCoord c = mesh.coordinate(mesh.rank_at(r));
            const int g = mesh.size(k);
            if ((s.kind == StepKind::all_gather || s.kind == StepKind::all_to_all) &&
                src.local_box(s.after, c).shape[s.before[k].dim()] % g != 0)
              even = false;
            if ((s.kind == StepKind::reduce_scatter || s.kind == StepKind::all_to_all) &&
                src.local_box(s.before, c).shape[s.after[k].dim()] % g != 0)
              even = false;
          }
          INFO(fmt::format("{} {} {} -> {}", mesh.shape(), shape, from, to));
          CHECK(detail::step_is_even(plan, s) == even);
          ++steps;
        }
      }
  }
  CHECK(steps > 1000);
}

TEST_CASE("bounded memory moves uneven pieces at their exact sizes", "[execute][planner]") {
  // 7 rows over 4 ranks (2, 2, 2, 1): a padded all-gather stages 4 pieces of 2 rows, more than
  // the 7 rows it gathers; under Memory::bounded the rows move exactly, straight into the
  // target, and a padded reduce-scatter's zero-filled 8 rows become slabs sent as they lie.
  const DeviceMesh mesh({4});
  for (const auto& [from, to] : {std::pair{"S(0)", "R"}, std::pair{"P", "S(0)"}}) {
    const Layout src(mesh, parse_placements(from), {7, 10});
    const Layout dst(mesh, parse_placements(to), {7, 10});
    const Plan fast = plan_redistribute(src, dst);
    const Plan bounded = plan_redistribute(src, dst, PlanOptions{.memory = Memory::bounded});
    INFO(from << " -> " << to);
    REQUIRE(fast.size() == 1);
    REQUIRE(bounded.size() == 1);
    CHECK(fast[0].padded);
    CHECK_FALSE(bounded[0].padded);
    CHECK(workspace_bytes(fast) > 70 * 4);
    CHECK(workspace_bytes(bounded) <= 70 * 4);
    CHECK(verified_on(bounded).verified);
  }
  // An exact reduction over pairs receives the other member's partial straight into the target
  // and reduces its own from the block where it lies: no scratch at all.
  const DeviceMesh pair({2});
  for (const char* to : {"S(0)", "R"}) {
    const Plan exact = plan_redistribute(
        Layout(pair, parse_placements("P"), {7, 10}), Layout(pair, parse_placements(to), {7, 10}),
        PlanOptions{.padding = Padding::never, .memory = Memory::bounded});
    INFO("P -> " << to);
    REQUIRE(exact.size() == 1);
    CHECK(workspace_bytes(exact) == 0);
    CHECK(verified_on(exact).verified);
  }
}

TEST_CASE("bounded memory cuts no group's block by elements", "[execute][planner]") {
  // Under the bytes objective an uneven exchange from a Partial may cut each group's block by
  // runs of its elements, which stages every member's partials of its run beside the reduced
  // rows (or packed columns): 4: P -> S(1) on 7x10 moves 236 B but holds 592-608 B on a strided
  // backend, where the larger end is 280 B. Under Memory::bounded such a plan counts as not
  // fitting: the reduce-scatter (252 B) holds what the bound allows.
  struct Case {
    const char *mesh, *from, *to;
  };
  for (const Case& k : {Case{"4", "P(sum)", "S(1)"}, Case{"2x2", "S(0),P(max)", "S(1),S(1)"},
                        Case{"2x4", "S(0),P(sum)", "R,S(1)"}}) {
    const DeviceMesh mesh = parse_mesh(k.mesh);
    const Layout src(mesh, parse_placements(k.from), {7, 10});
    const Layout dst(mesh, parse_placements(k.to), {7, 10});
    const Plan any = plan_redistribute(src, dst, PlanOptions{.objective = Objective::bytes});
    const Plan bounded = plan_redistribute(
        src, dst, PlanOptions{.objective = Objective::bytes, .memory = Memory::bounded});
    INFO(explain(any) << explain(bounded));
    auto cuts_by_elements = [](const Plan& plan) {
      bool any_step = false;
      for (const Step& s : plan) any_step = any_step || s.by_elements;
      return any_step;
    };
    auto within_ends = [&](const Plan& plan) {
      bool within = true;
      for (int rank = 0; rank < mesh.size(); ++rank)
        within = within && workspace_bytes<SimulatedBackend>(plan, rank) <=
                               std::max(src.local_bytes(rank), dst.local_bytes(rank));
      return within;
    };
    CHECK(cuts_by_elements(any));
    CHECK_FALSE(within_ends(any));
    CHECK_FALSE(cuts_by_elements(bounded));
    CHECK(within_ends(bounded));
    CHECK(bounded.bytes_recv_max() > any.bytes_recv_max());
    CHECK(verified_on(bounded).verified);
  }
}

TEST_CASE("a Partial the target keeps stays through an exchange", "[execute][planner]") {
  // Each class of the kept Partial (one part each) exchanges its part among itself. On 2x2x2
  // under bounded memory the exchange replaces an all-gather to a block twice either end; on
  // 3x3x4x3 under the bytes objective, one exchange that reduces the P(max) and keeps the P(sum)
  // (each class of the P(sum) reducing and delivering among itself) moves 192 B of i64, where a
  // reduce-scatter and an exchange moved 224 B and the collectives alone move 2,432 B.
  const DeviceMesh cube({2, 2, 2});
  const Plan bounded = plan_redistribute(Layout(cube, parse_placements("P,S(0),R"), {16, 8}),
                                         Layout(cube, parse_placements("P,R,S(0)"), {16, 8}),
                                         PlanOptions{.memory = Memory::bounded});
  REQUIRE(bounded.size() == 1);
  CHECK(bounded[0].kind == StepKind::exchange);
  CHECK(bounded[0].before[0].is_partial());
  CHECK(blocks_within_ends(bounded));
  CHECK(verified_on(bounded).verified);
  const DeviceMesh mesh({3, 3, 4, 3});
  for (DType dtype : {DType::i64, DType::f32}) {
    const Plan bytes = plan_redistribute(
        Layout(mesh, parse_placements("S(1),P(max),S(1),P(sum)"), {16, 12}, dtype),
        Layout(mesh, parse_placements("R,S(1),S(1),P(sum)"), {16, 12}, dtype),
        PlanOptions{.objective = Objective::bytes});
    INFO(explain(bytes));
    CHECK(bytes.bytes_recv_max() == 24 * static_cast<std::int64_t>(size_of(dtype)));
    REQUIRE(bytes.size() == 1);
    CHECK(bytes[0].kind == StepKind::exchange);
    CHECK(detail::reduced_partials(bytes[0].before, bytes[0].after).dims == 2);
    CHECK(detail::reduced_partials(bytes[0].before, bytes[0].after).kept == 8);
    const Verification v = verified_on(bytes);
    CHECK(v.difference == "");
    CHECK(v.verified);
  }
}

TEST_CASE("mixed Partial ops where a kept inner shard blocks a made Partial, executed",
          "[execute][planner]") {
  // The pairs of {R, S(0), P(sum), P(max)} on 2x2x2x2 where the target makes a Partial from a
  // shard on mesh dim k that a shard of the same tensor dim on a later mesh dim, in both
  // layouts, nests inside, and a target Partial of another op lies outside k: until the
  // planner gathered everything first in that case, it found no plan for some of them. Each
  // runs on the simulator against the global view.
  const Placement options[] = {Replicate(), Shard(0), Partial(), Partial(ReduceOp::max)};
  const DeviceMesh m({2, 2, 2, 2});
  int runs = 0;
  testing::for_each_pair(m, options, [&](int, int, const Placements& a, const Placements& b) {
    bool blocked = false;
    for (int k = 0; k < m.ndim(); ++k) {
      if (!a[k].is_shard() || !b[k].is_partial()) continue;
      bool nested = false, other_op = false;
      for (int j = k + 1; j < m.ndim(); ++j) nested = nested || (a[j] == a[k] && b[j] == a[k]);
      for (int i = 0; i < k; ++i)
        other_op = other_op || (b[i].is_partial() && b[i].reduce_op() != b[k].reduce_op());
      blocked = blocked || (nested && other_op);
    }
    if (!blocked) return;
    for (const Shape& shape : {Shape{8}, Shape{5}}) {
      const Plan p = plan_redistribute(Layout(m, a, shape), Layout(m, b, shape));
      const Verification v = verified_on(p);
      INFO(fmt::format("{} -> {} {}: {}", a, b, shape, v.difference));
      CHECK(v.verified);
      ++runs;
    }
  });
  CHECK(runs > 0);
}

TEST_CASE("mixed Partial ops reduced by a collective, then by an exchange, executed",
          "[execute][planner]") {
  // (P(max), P(sum), S(0)) -> (S(1), R, S(1)) on 2x2x2 under the bytes objective: the P(max)
  // reduce-scattered along mesh dim 0, then one exchange reduces the P(sum) into the target;
  // even and uneven, on strided and packing backends, against the global view.
  const DeviceMesh cube({2, 2, 2});
  for (const Shape& shape : {Shape{8, 16}, Shape{5, 7}}) {
    const Layout src(cube, parse_placements("P(max),P(sum),S(0)"), shape);
    const Layout dst(cube, parse_placements("S(1),R,S(1)"), shape);
    const Plan plan = plan_redistribute(src, dst, {.objective = Objective::bytes});
    INFO(explain(plan));
    REQUIRE(plan.size() == 2);
    CHECK(plan[0].kind == StepKind::reduce_scatter);
    CHECK(plan[1].kind == StepKind::exchange);
    CHECK(detail::exchange_reduces(plan[1].before, plan[1].after));
    run_strided_and_packed(plan);
    CHECK(verified_on(plan).verified);
  }
}

TEST_CASE("an exchange from a Partial, then the Partial made again with another op, executed",
          "[execute][planner]") {
  // The exchange reduces the source's P(sum) and leaves S(d) or R where the target is P(max);
  // a fill makes it after. Even and uneven, strided and packing backends, the global view.
  const DeviceMesh mesh({2, 4}), cube({2, 2, 2});
  const std::tuple<const DeviceMesh*, const char*, const char*, PlanOptions> cases[] = {
      {&mesh, "P(sum),S(1)", "P(max),R", {.objective = Objective::bytes}},
      {&cube, "P(sum),S(1),S(0)", "P(max),S(0),S(0)", {.memory = Memory::bounded}},
      {&cube, "P(max),S(1),R", "P(sum),P(max),S(0)", {.objective = Objective::bytes}},
  };
  int made_again = 0;
  for (const auto& [m, from, to, options] : cases)
    for (const Shape& shape : {Shape{8, 16}, Shape{7, 10}}) {
      const Plan plan = plan_redistribute(Layout(*m, parse_placements(from), shape),
                                          Layout(*m, parse_placements(to), shape), options);
      INFO(explain(plan));
      run_strided_and_packed(plan);
      CHECK(verified_on(plan).verified);
      // A fill after the exchange where the exchange reduced a Partial.
      for (std::size_t i = 0; i < plan.size(); ++i)
        for (std::size_t j = i + 1; j < plan.size() && plan[i].kind == StepKind::exchange; ++j)
          if (plan[j].kind == StepKind::fill && plan[i].before[plan[j].mesh_dim].is_partial())
            ++made_again;
    }
  // All but the first pair's 8x16, where a reduce-scatter, an all-gather and the fill reach the
  // bound as well.
  CHECK(made_again == 5);
}

TEST_CASE("exchanges into and from a Partial on more than 64 ranks, executed",
          "[execute][planner]") {
  // Beyond 64 ranks the planner makes and reduces Partials in one exchange too; each plan runs
  // on 72 and 128 simulated ranks against the global view, its bytes as planned.
  const DeviceMesh wide({4, 2, 3, 3}), square({2, 8, 8});
  const Plan pairs[] = {
      plan_redistribute(Layout(wide, parse_placements("R,S(0),R,R"), {5, 17}),
                        Layout(wide, parse_placements("P(max),R,R,R"), {5, 17}),
                        {.objective = Objective::bytes}),
      plan_redistribute(Layout(square, parse_placements("P(sum),S(1),S(0)"), {28, 19}),
                        Layout(square, parse_placements("S(0),S(0),S(1)"), {28, 19}),
                        {.objective = Objective::bytes}),
      plan_redistribute(Layout(wide, parse_placements("S(1),S(0),P(sum),R"), {7, 9}),
                        Layout(wide, parse_placements("P(sum),S(1),R,S(0)"), {7, 9}),
                        {.objective = Objective::bytes})};
  for (const Plan& p : pairs) {
    REQUIRE(std::any_of(p.begin(), p.end(), [](const Step& s) {
      return s.kind == StepKind::exchange && (detail::makes_partial(s.before, s.after) ||
                                              detail::exchange_reduces(s.before, s.after));
    }));
    const Verification v = verified_on(p);
    INFO(fmt::format("{}{}", explain(p), v.difference));
    CHECK(v.verified);
    for (int r = 0; r < p.src().mesh().size(); ++r)
      CHECK(v.measured[static_cast<std::size_t>(r)] == rank_bytes(p, p.src().mesh().rank_at(r)));
  }
}

TEST_CASE("a Partial target is checked within the rounding of its parts", "[execute][verify]") {
  // R -> P(sum) divides by the group size; on 3 ranks in bf16 each part is rounded, and the
  // parts of a source Partial (1, 2, 3, x - 6 on 4 ranks) are larger than the value they sum
  // to: the error of their reduction scales with the parts' magnitudes (about 1.4% of an
  // element of 1 here), which verify_on_simulator reported as a difference until 2026-11-25.
  const DeviceMesh m({4, 3});
  for (const char* to : {"P,P", "R,P"}) {
    const Plan p = plan_redistribute(Layout(m, parse_placements("P,R"), {6, 5}, DType::bf16),
                                     Layout(m, parse_placements(to), {6, 5}, DType::bf16));
    const Verification v = verified_on(p);
    INFO(v.difference);
    CHECK(v.verified);
  }
}

TEST_CASE("a step that runs in place reuses the scratch of the block before", "[execute][memory]") {
  // (P(sum), P(max)) -> (P(max), S(0)) through Replicate on mesh dim 0 (the planner now
  // reduce-scatters and fills instead, so the plan is built from its transitions): the
  // all-reduce writes a block larger than the target into scratch, and the scale after it runs
  // in that scratch, so one block is held, not two.
  const DeviceMesh mesh({2, 2});
  detail::Transitions through_replicate;
  through_replicate.push_back({0, Placement::partial(ReduceOp::sum), Placement::replicate()});
  through_replicate.push_back({0, Placement::replicate(), Placement::partial(ReduceOp::max)});
  through_replicate.push_back({1, Placement::partial(ReduceOp::max), Placement::shard(0)});
  for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    const Plan plan = detail::plan_builder::build(
        Layout(mesh, parse_placements("P(sum),P(max)"), {8, 16}, dtype),
        Layout(mesh, parse_placements("P(max),S(0)"), {8, 16}, dtype), through_replicate,
        PlanOptions{.memory = Memory::bounded}.with_cost_model(CostModel::defaults(mesh)));
    INFO(explain(plan));
    REQUIRE(plan.size() == 3);
    REQUIRE(plan[0].kind == StepKind::all_reduce);
    REQUIRE(plan[1].kind == StepKind::scale);
    const MeshCoord origin{0, 0};
    const detail::BlockPlacement placed = detail::place_blocks(plan, origin, 0, {});
    CHECK(placed.reuses == 2u);  // the scale's block
    const std::int64_t block = 8 * 16 * size_of(dtype);
    CHECK(placed.peak == block);
    CHECK(workspace_bytes(plan) == block);
    const Verification v = verified_on(plan);
    CHECK(v.verified);
    CHECK(v.difference == "");
    const SimulatedRun run =
        detail::visit_dtype(dtype, [&]<class T>() { return run_simulated<T>(plan, false); });
    for (std::int64_t peak : run.scratch_peak) CHECK(peak == block);
  }
}

TEST_CASE("a block moves in place into a larger one around it", "[execute][memory]") {
  // detail::expand_box_in_place against a copy into another buffer, on random boxes of 1 to 4
  // dims (empty ones, whole trailing dims and a box at the origin among them).
  std::mt19937 rng(7);
  int cases = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int nd = 1 + trial % 4;
    Shape outer, inner, at;
    for (int d = 0; d < nd; ++d) {
      outer.push_back(std::uniform_int_distribution<std::int64_t>(0, 5)(rng));
      inner.push_back(std::uniform_int_distribution<std::int64_t>(0, outer[d])(rng));
      if (trial % 3 == 0 && d > 0) inner[d] = outer[d];
      at.push_back(std::uniform_int_distribution<std::int64_t>(0, outer[d] - inner[d])(rng));
    }
    const auto count = [](const Shape& s) {
      std::int64_t n = 1;
      for (std::int64_t e : s) n *= e;
      return static_cast<std::size_t>(n);
    };
    std::vector<std::int32_t> data(count(outer), -2), expected(count(outer), -1);
    for (std::size_t i = 0; i < count(inner); ++i) data[i] = static_cast<std::int32_t>(i);
    const std::vector<std::int32_t> block(data.begin(),
                                          data.begin() + static_cast<std::ptrdiff_t>(count(inner)));
    detail::copy_box(reinterpret_cast<const std::byte*>(block.data()), inner, Shape(nd, 0),
                     reinterpret_cast<std::byte*>(expected.data()), outer, at, inner,
                     sizeof(std::int32_t));
    detail::expand_box_in_place(reinterpret_cast<std::byte*>(data.data()), inner, outer, at,
                                sizeof(std::int32_t), [](std::byte* run, std::int64_t n) {
                                  std::fill_n(reinterpret_cast<std::int32_t*>(run), n, -1);
                                });
    INFO(fmt::format("inner {} at {} in {}", inner, at, outer));
    CHECK(data == expected);
    cases += count(inner) > 0 && count(inner) < count(outer);
  }
  CHECK(cases > 80);
}

TEST_CASE("a device's moves of a block in place into a larger one read nothing they wrote",
          "[execute][memory]") {
  // detail::expand_moves (cuda::fill_around_in_place runs a launch per move, every element of a
  // move at once) on random boxes of 1 to 4 dims: no move writes an element that it or a later
  // move reads, the moves run with every read before every write end where a copy puts the
  // block (rows overlapping their own places, which go in pieces, among them), and
  // ExpandGeometry::holds says which elements of outer are the block's.
  std::mt19937 rng(11);
  int moved = 0, most_moves = 0, pieces = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int nd = 1 + trial % 4;
    Shape outer, inner, at;
    for (int d = 0; d < nd; ++d) {
      outer.push_back(std::uniform_int_distribution<std::int64_t>(0, nd == 1 ? 40 : 9)(rng));
      inner.push_back(std::uniform_int_distribution<std::int64_t>(0, outer[d])(rng));
      if (trial % 3 == 0 && d > 0) inner[d] = outer[d];
      at.push_back(std::uniform_int_distribution<std::int64_t>(0, outer[d] - inner[d])(rng));
    }
    std::int64_t inner_count = 1, outer_count = 1;
    for (int d = 0; d < nd; ++d) inner_count *= inner[d], outer_count *= outer[d];
    std::vector<std::int32_t> data(static_cast<std::size_t>(outer_count), -2);
    std::vector<std::int32_t> expected(data.size(), -1);
    for (std::int64_t i = 0; i < inner_count; ++i) data[static_cast<std::size_t>(i)] = 1 + i;
    const std::vector<std::int32_t> block(data.begin(), data.begin() + inner_count);
    detail::copy_box(reinterpret_cast<const std::byte*>(block.data()), inner, Shape(nd, 0),
                     reinterpret_cast<std::byte*>(expected.data()), outer, at, inner,
                     sizeof(std::int32_t));
    INFO(fmt::format("inner {} at {} in {}", inner, at, outer));
    const detail::ExpandGeometry g = detail::expand_geometry(inner, outer, at);
    // Every move's reads and writes; then its copies, all reads first.
    std::vector<std::pair<std::int64_t, std::int64_t>> moves;  // (from, to) of each element
    std::vector<std::size_t> ends;                             // each move's end in `moves`
    detail::expand_moves(g, [&](const detail::ExpandMove& m) {
      REQUIRE(m.first < m.last);
      REQUIRE(m.from < m.to);
      pieces += m.to - m.from < g.run ? 1 : 0;
      for (std::int64_t s = m.first; s < m.last; ++s)
        for (std::int64_t j = m.from; j < m.to; ++j) moves.emplace_back(s * g.run + j, g.to(s) + j);
      ends.push_back(moves.size());
    });
    std::vector<bool> read_later(data.size(), false);
    bool clean = true;
    for (std::size_t m = ends.size(), stop = moves.size(); m-- > 0;) {
      const std::size_t start = m == 0 ? 0 : ends[m - 1];
      for (std::size_t e = start; e < stop; ++e)
        read_later[static_cast<std::size_t>(moves[e].first)] = true;
      for (std::size_t e = start; e < stop; ++e)
        clean = clean && !read_later[static_cast<std::size_t>(moves[e].second)];
      stop = start;
    }
    CHECK(clean);
    for (std::size_t m = 0, start = 0; m < ends.size(); start = ends[m++]) {
      std::vector<std::int32_t> values;
      for (std::size_t e = start; e < ends[m]; ++e)
        values.push_back(data[static_cast<std::size_t>(moves[e].first)]);
      for (std::size_t e = start; e < ends[m]; ++e)
        data[static_cast<std::size_t>(moves[e].second)] = values[e - start];
    }
    for (std::int64_t i = 0; i < outer_count; ++i) {
      const bool inside = expected[static_cast<std::size_t>(i)] != -1;
      CHECK(g.holds(i) == inside);
      if (!g.holds(i)) data[static_cast<std::size_t>(i)] = -1;
    }
    CHECK(data == expected);
    moved += ends.empty() ? 0 : 1;
    most_moves = std::max(most_moves, static_cast<int>(ends.size()));
  }
  CHECK(moved > 1000);
  CHECK(most_moves > 1);
  CHECK(pieces > 50);
  // A fill's block is a piece of g of its target along one dim: each move takes the rows whose
  // places lie past what is left, about (g - 1) / g of them, so the moves number about
  // log_g(rows) (a launch each); a block of whole rows that moves past its end takes one.
  for (const auto& [inner, outer, at, moves] :
       {std::tuple{Shape{1024, 512}, Shape{1024, 1024}, Shape{0, 512}, 11},
        std::tuple{Shape{1024, 512}, Shape{1024, 1024}, Shape{0, 0}, 10},
        std::tuple{Shape{4096, 64}, Shape{4096, 512}, Shape{0, 0}, 4},
        std::tuple{Shape{2049, 16}, Shape{4097, 16}, Shape{0, 0}, 0},
        std::tuple{Shape{2048, 16}, Shape{4097, 16}, Shape{2049, 0}, 1},
        std::tuple{Shape{16, 2049}, Shape{16, 4097}, Shape{0, 0}, 6}}) {
    int n = 0;
    detail::expand_moves(detail::expand_geometry(inner, outer, at),
                         [&](const detail::ExpandMove&) { ++n; });
    INFO(fmt::format("inner {} at {} in {}", inner, at, outer));
    CHECK(n == moves);
  }
}

TEST_CASE("a fill whose block lies in its target runs there", "[execute][memory]") {
  // (S(0), P) -> (P, S(0)) on 2x4 under Memory::bounded all-to-alls mesh dim 0 (to the source's
  // size), reduce-scatters mesh dim 1 into the target and fills mesh dim 0 there: on host
  // backends the fill moves the block in place, so the run holds the all-to-all's block alone,
  // not it and the reduce-scatter's beside it (320 of 256 bytes, f32).
  for (DType dtype : {DType::f32, DType::bf16, DType::i64})
    for (std::string_view to : {"P(sum),S(0)", "P(max),S(0)", "P(avg),S(0)"})
      for (const Shape& shape : {Shape{8, 16}, Shape{16, 8}}) {
        if (dtype == DType::i64 && to.starts_with("P(avg)")) continue;
        const DeviceMesh mesh({2, 4});
        const Plan plan =
            plan_redistribute(Layout(mesh, parse_placements("S(0),P(sum)"), shape, dtype),
                              Layout(mesh, parse_placements(to), shape, dtype),
                              PlanOptions{.memory = Memory::bounded});
        INFO(fmt::format("{} {} {}", to, shape, dtype));
        INFO(explain(plan));
        REQUIRE(plan.size() == 3);
        REQUIRE(plan[2].kind == StepKind::fill);
        std::int64_t ends = 0;
        for (int r = 0; r < mesh.size(); ++r)
          ends = std::max({ends, plan.src().local_box(mesh.coordinate(r)).numel(),
                           plan.dst().local_box(mesh.coordinate(r)).numel()});
        ends *= size_of(dtype);
        constexpr detail::LinkAbilities host = detail::abilities_of<detail::Link<SimulatedBackend>>;
        STATIC_REQUIRE(host.fills_in_place);
        STATIC_REQUIRE_FALSE(detail::LinkAbilities{}.fills_in_place);
        if (shape[0] == 8) {
          const detail::BlockPlacement placed = detail::place_blocks(plan, {0, 0}, 0, host);
          CHECK(placed.in_target == 2u);  // the reduce-scatter's block
          CHECK(placed.peak == ends);
          CHECK(detail::place_blocks(plan, {0, 0}, 0, {}).peak > ends);
        }
        CHECK(workspace_bytes<SimulatedBackend>(plan) <= ends);
        CHECK(workspace_bytes<PackingBackend>(plan) <= ends);
        const Verification v = verified_on(plan);
        CHECK(v.verified);
        CHECK(v.difference == "");
        for (bool packing : {false, true}) {
          const SimulatedRun run = detail::visit_dtype(
              dtype, [&]<class T>() { return run_simulated<T>(plan, packing); });
          for (int r = 0; r < mesh.size(); ++r)
            CHECK(run.scratch_peak[static_cast<std::size_t>(r)] ==
                  (packing ? workspace_bytes<PackingBackend>(plan, mesh.rank_at(r))
                           : workspace_bytes<SimulatedBackend>(plan, mesh.rank_at(r))));
        }
      }
}

TEST_CASE("local steps that move no element run in place", "[execute][memory]") {
  // (P(max), P(sum), S(0)) -> (P(max), S(0), S(1)) on 2x2x2 reduce-scatters an 8x8 block into
  // 4x8, then fills mesh dim 0 and chunks mesh dim 2: each rank keeps its 4x8 block where it lies
  // (coordinates 0 and 2 alike) or sets it to the identity, so the reduce-scatter writes the
  // target and the local steps run there: 256 B of scratch (the 8x8 block), not 384.
  const DeviceMesh mesh({2, 2, 2});
  const Plan plan = plan_redistribute(Layout(mesh, parse_placements("P(max),P(sum),S(0)"), {8, 16}),
                                      Layout(mesh, parse_placements("P(max),S(0),S(1)"), {8, 16}),
                                      PlanOptions{.memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 5);
  REQUIRE(plan[3].kind == StepKind::fill);
  REQUIRE(plan[4].kind == StepKind::chunk);
  for (int r = 0; r < mesh.size(); ++r) {
    const MeshCoord me = mesh.coordinate_at(r);
    CHECK(detail::local_steps_in_place(plan, 3, 4, me));
    const detail::BlockPlacement placed =
        detail::place_blocks(plan, me, 0, detail::abilities_of<detail::Link<SimulatedBackend>>);
    CHECK((placed.in_target >> 2 & 1u) == 1u);  // the reduce-scatter's block
    CHECK(placed.peak == 256);
  }
  CHECK_FALSE(detail::local_steps_in_place(plan, 2, 4, mesh.coordinate_at(0)));  // 8x8 to 4x8
  CHECK(workspace_bytes<SimulatedBackend>(plan) == 256);
  CHECK(workspace_bytes<PackingBackend>(plan) == 256);
  const auto runs = run_strided_and_packed(plan);
  check_within_ends(runs.first, plan.src(), plan.dst());
  check_within_ends(runs.second, plan.src(), plan.dst());
  const Verification v = verified_on(plan);
  CHECK(v.verified);
  CHECK(v.difference == "");
}

TEST_CASE("a chunk that keeps a slab of its block is read where it lies", "[execute][memory]") {
  // (R, P(sum)) -> (S(0), S(1)) on 2x4 chunks the rows, then reduce-scatters the columns: the
  // reduce-scatter reads the rows in the source, so the run holds only the partials it stages
  // (two of 8x2, its own reduced where it lies), not a copy of the 4x16 rows besides. (R, S(0),
  // P(sum)) -> (S(0), R, S(0)) on 2x2x2 all-gathers, chunks the rows of the gathered block and
  // reduce-scatters them: the chunk is read in the all-gather's scratch, which is freed after
  // the reduce-scatter, so one 8x16 block is held, not that and a 4x16 copy.
  struct Case {
    const char *mesh, *from, *to;
    std::uint32_t views;
    std::int64_t peak;      // on the simulated backend (strided pieces)
    std::int64_t any_peak;  // on any backend
  };
  for (const Case& k : {Case{"2x4", "R,P(sum)", "S(0),S(1)", 1u, 128, 256},
                        Case{"2x2x2", "R,S(0),P(sum)", "S(0),R,S(0)", 2u, 512, 512}}) {
    const DeviceMesh mesh = parse_mesh(k.mesh);
    const Plan plan = plan_redistribute(Layout(mesh, parse_placements(k.from), {8, 16}),
                                        Layout(mesh, parse_placements(k.to), {8, 16}));
    INFO(explain(plan));
    const MeshCoord origin(static_cast<std::size_t>(mesh.ndim()), 0);
    const detail::BlockPlacement placed =
        detail::place_blocks(plan, origin, 0, detail::abilities_of<detail::Link<SimulatedBackend>>);
    CHECK(placed.views == k.views);
    CHECK(plan[std::countr_zero(k.views)].kind == StepKind::chunk);
    CHECK(workspace_bytes<SimulatedBackend>(plan) == k.peak);
    CHECK(workspace_bytes(plan) == k.any_peak);
    const Verification v = verified_on(plan);
    CHECK(v.verified);
    CHECK(v.difference == "");
    for (bool packing : {false, true}) {
      const SimulatedRun run = run_simulated<float>(plan, packing);
      for (int r = 0; r < mesh.size(); ++r)
        CHECK(run.scratch_peak[static_cast<std::size_t>(r)] ==
              (packing ? workspace_bytes<PackingBackend>(plan, mesh.rank_at(r))
                       : workspace_bytes<SimulatedBackend>(plan, mesh.rank_at(r))));
    }
  }
}

TEST_CASE("plan_redistribute_for plans within the ends on the backend it is for",
          "[execute][memory]") {
  // Under Memory::bounded the planner bounds the blocks between steps, not staging: on 2x4,
  // (S(1), R) -> (S(0), S(0)) all-to-alls the columns into 4x16 rows (256 B, the larger end) and
  // chunks them, and a backend that packs stages the piece received beside that block (384 B).
  // For it, plan_redistribute_for takes the bytes objective's plan, one exchange of what each
  // rank lacks; on the strided backends the time objective's plan stays within and is kept.
  // Every matrix pair of 2x2 and 2x4 at 8x16 and 7x10 (f32) stays within on both kinds; 22 change
  // on the backend that packs.
  const DeviceMesh mesh({2, 4});
  const Layout src(mesh, parse_placements("S(1),R"), {8, 16});
  const Layout dst(mesh, parse_placements("S(0),S(0)"), {8, 16});
  const PlanOptions bounded{.memory = Memory::bounded};
  const Plan fastest = plan_redistribute(src, dst, bounded);
  REQUIRE(fastest.size() == 2);
  CHECK(fastest[0].kind == StepKind::all_to_all);
  CHECK(scratch_within_ends<SimulatedBackend>(fastest));
  CHECK_FALSE(scratch_within_ends<PackingBackend>(fastest));
  CHECK(workspace_bytes<PackingBackend>(fastest) == 384);
  CHECK(plan_redistribute_for<SimulatedBackend>(src, dst, bounded) == fastest);
  const Plan packed = plan_redistribute_for<PackingBackend>(src, dst, bounded);
  INFO(explain(packed));
  REQUIRE(packed.size() == 1);
  CHECK(packed[0].kind == StepKind::exchange);
  CHECK(packed.options().objective == Objective::bytes);
  CHECK(packed.memory_bounded());
  CHECK(scratch_within_ends<PackingBackend>(packed));
  const Verification v = verified_on(packed);
  CHECK(v.verified);
  CHECK(v.difference == "");
  const SimulatedRun run = run_simulated<float>(packed, true);
  for (int r = 0; r < mesh.size(); ++r) {
    const int rank = mesh.rank_at(r);
    CHECK(run.scratch_peak[static_cast<std::size_t>(r)] ==
          workspace_bytes<PackingBackend>(packed, rank));
    CHECK(run.scratch_peak[static_cast<std::size_t>(r)] <=
          std::max(src.local_bytes(rank), dst.local_bytes(rank)));
  }
  // Below the 1 MiB blocks from which Memory::automatic seeks the bound: plan_redistribute's plan.
  CHECK(plan_redistribute_for<PackingBackend>(src, dst) == plan_redistribute(src, dst));
  SimulatedWorld& world = world_of(mesh);
  world.run([&](SimulatedBackend& b) {
    if (b.rank() == 0) CHECK(plan_redistribute_for(src, dst, b, bounded) == fastest);
  });

  const Placement each[] = {Placement::replicate(), Placement::shard(0), Placement::shard(1),
                            Placement::partial(ReduceOp::sum), Placement::partial(ReduceOp::max)};
  // Every exhaustive_stride()-th pair (the sanitizer preset samples): the counts need them all.
  const bool every_pair = testing::exhaustive_stride() == 1;
  int changed = 0, pairs = 0;
  for (const char* m : {"2x2", "2x4"}) {
    const DeviceMesh grid = parse_mesh(m);
    for (const Shape& shape : {Shape{8, 16}, Shape{7, 10}}) {
      auto check_pair = [&](int, int, const Placements& from, const Placements& to) {
        const Layout a(grid, from, shape);
        const Layout b(grid, to, shape);
        const Plan p = plan_redistribute_for<PackingBackend>(a, b, bounded);
        INFO(explain(p));
        CHECK(scratch_within_ends<PackingBackend>(p));
        CHECK(scratch_within_ends<SimulatedBackend>(
            plan_redistribute_for<SimulatedBackend>(a, b, bounded)));
        changed += p == plan_redistribute(a, b, bounded) ? 0 : 1;
        ++pairs;
      };
      testing::for_each_pair(grid, each, check_pair);
    }
  }
  if (every_pair) {
    CHECK(pairs == 2'500);
    CHECK(changed == 22);  // docs/execution.md's memory table: the bounded packing row
  }

  // On 2x2x2 the bounded plan often holds two blocks at the bound around a step (each within
  // it): (P(max), P(sum), S(0)) -> (P(max), S(0), S(0)) all-gathers mesh dim 2 into 8x8 and
  // reduce-scatters that into 4x8, 384 B where the larger end is 256; the chain of Memory::any
  // (a fill, then two reduce-scatters) holds 256. Every pair at 8x16 and 7x10: how many stay
  // over on each kind of backend, planned for it or not; those planned for the backend that
  // changed, run on both kinds, hold what was planned and reach the target.
  const DeviceMesh cube({2, 2, 2});
  int over[2][2] = {}, ran = 0;  // [packing][planned for it]
  for (const Shape& shape : {Shape{8, 16}, Shape{7, 10}})
    testing::for_each_pair(
        cube, each, [&](int x, int y, const Placements& from, const Placements& to) {
          const Layout a(cube, from, shape);
          const Layout b(cube, to, shape);
          const Plan plain = plan_redistribute(a, b, bounded);
          const Plan packed = plan_redistribute_for<PackingBackend>(a, b, bounded);
          const Plan strided = plan_redistribute_for<SimulatedBackend>(a, b, bounded);
          over[1][0] += scratch_within_ends<PackingBackend>(plain) ? 0 : 1;
          over[0][0] += scratch_within_ends<SimulatedBackend>(plain) ? 0 : 1;
          over[1][1] += scratch_within_ends<PackingBackend>(packed) ? 0 : 1;
          over[0][1] += scratch_within_ends<SimulatedBackend>(strided) ? 0 : 1;
          if (packed == plain || shape[0] != 8 || (x + y) % 4 != 0) return;
          INFO(explain(packed));
          CHECK(packed.memory_bounded());
          const auto runs = run_strided_and_packed(packed);
          check_within_ends(runs.second, a, b);
          CHECK(verified_on(packed).verified);
          ++ran;
        });
  // Memory::automatic seeks the bound from 1 MiB blocks: a plan for the backend there too, within
  // the slack (here the same time and bytes, run as bounded).
  const Layout large_src(cube, parse_placements("P(sum),R,S(0)"), {4096, 8192});
  const Layout large_dst(cube, parse_placements("S(0),R,R"), {4096, 8192});
  const Plan usual = plan_redistribute(large_src, large_dst);
  const Plan for_nccl = plan_redistribute_for<PackingBackend>(large_src, large_dst);
  CHECK_FALSE(scratch_within_ends<PackingBackend>(usual));
  CHECK(scratch_within_ends<PackingBackend>(for_nccl));
  CHECK(for_nccl.memory_bounded());
  CHECK(for_nccl.options().memory == Memory::automatic);
  CHECK(for_nccl.est_us() <= (1 + PlanOptions{}.memory_slack) * usual.est_us());
  // Where no plan of the four is within, the bounded ones without all-to-alls: (R, S(0), R) ->
  // (S(1), S(1), S(0)) of 7x10 chunks, all-to-alls its uneven pieces as exact messages with
  // staging and chunks, 164 B on a rank whose larger end is 160 B; one exchange holds none.
  const Layout rows(cube, parse_placements("R,S(0),R"), {7, 10});
  const Layout cols(cube, parse_placements("S(1),S(1),S(0)"), {7, 10});
  CHECK(workspace_bytes<SimulatedBackend>(plan_redistribute(rows, cols, bounded)) == 164);
  const Plan exchanged = plan_redistribute_for<SimulatedBackend>(rows, cols, bounded);
  INFO(explain(exchanged));
  REQUIRE(exchanged.size() == 1);
  CHECK(exchanged[0].kind == StepKind::exchange);
  CHECK_FALSE(exchanged.options().allow_all_to_all);
  CHECK(exchanged.memory_bounded());
  CHECK(workspace_bytes<SimulatedBackend>(exchanged) == 0);
  CHECK(verified_on(exchanged).verified);
  // Where none of those is within either, one exchange straight to the target
  // (one_exchange_plan): (P(sum), S(1), R) -> (S(1), R, S(1)) of 7x10 reduces its P(sum) on the
  // way, 112 B of scratch where the larger end is 140 B (the bounded plan: 168 B); (S(1), R, R) ->
  // (R, S(1), S(0)) of 8x16 gathers a 4x16 block at the larger end with a packed copy beside it
  // (512 B on a backend that packs), where the exchange holds none; (S(1), S(1), P(sum)) -> (R,
  // S(1), P(sum)) of 8x16 keeps the P(sum), each class exchanging among itself (384 B on a backend
  // that packs against 256); (P(sum), P(sum), S(1)) -> (P(sum), S(1), R) of 8x16 reduces one
  // P(sum) and keeps the other (384 B against 256); (P(max), R, S(1)) -> (P(sum), S(1), R) of 8x16
  // reduces the P(max) into (S(0), S(1), R) and fills the P(sum) after it (384 B against 256).
  const Layout summed(cube, parse_placements("P(sum),S(1),R"), {7, 10});
  const Layout split(cube, parse_placements("S(1),R,S(1)"), {7, 10});
  const Layout halves(cube, parse_placements("S(1),R,R"), {8, 16});
  const Layout quarters(cube, parse_placements("R,S(1),S(0)"), {8, 16});
  CHECK(workspace_bytes<SimulatedBackend>(plan_redistribute(summed, split, bounded)) == 168);
  CHECK(workspace_bytes<PackingBackend>(plan_redistribute(halves, quarters, bounded)) == 512);
  const Layout kept_src(cube, parse_placements("S(1),S(1),P(sum)"), {8, 16});
  const Layout kept_dst(cube, parse_placements("R,S(1),P(sum)"), {8, 16});
  CHECK(workspace_bytes<PackingBackend>(plan_redistribute(kept_src, kept_dst, bounded)) == 384);
  const Layout sums(cube, parse_placements("P(sum),P(sum),S(1)"), {8, 16});
  const Layout kept_sum(cube, parse_placements("P(sum),S(1),R"), {8, 16});
  const Layout maxed(cube, parse_placements("P(max),R,S(1)"), {8, 16});
  CHECK(workspace_bytes<PackingBackend>(plan_redistribute(sums, kept_sum, bounded)) == 384);
  CHECK(workspace_bytes<PackingBackend>(plan_redistribute(maxed, kept_sum, bounded)) == 384);
  auto one_exchange = [&](const Plan& plan, const Layout& from, const Layout& to) {
    INFO(explain(plan));
    CHECK(plan[0].kind == StepKind::exchange);
    CHECK(plan.memory_bounded());
    const std::optional<Plan> direct = detail::one_exchange_plan(from, to, bounded);
    REQUIRE(direct);
    REQUIRE(plan.size() == direct->size());
    for (std::size_t i = 0; i < plan.size(); ++i) CHECK(plan[i] == (*direct)[i]);
    CHECK(scratch_within_ends<SimulatedBackend>(plan));
    CHECK(scratch_within_ends<PackingBackend>(plan));
    const auto runs = run_strided_and_packed(plan);
    check_within_ends(runs.second, from, to);
    CHECK(verified_on(plan).verified);
  };
  one_exchange(plan_redistribute_for<SimulatedBackend>(summed, split, bounded), summed, split);
  one_exchange(plan_redistribute_for<PackingBackend>(halves, quarters, bounded), halves, quarters);
  one_exchange(plan_redistribute_for<PackingBackend>(kept_src, kept_dst, bounded), kept_src,
               kept_dst);
  const Plan reduced_and_kept = plan_redistribute_for<PackingBackend>(sums, kept_sum, bounded);
  one_exchange(reduced_and_kept, sums, kept_sum);
  CHECK(reduced_and_kept.size() == 1);
  CHECK(detail::reduced_partials(reduced_and_kept[0].before, reduced_and_kept[0].after).kept == 1);
  const Plan made_again = plan_redistribute_for<PackingBackend>(maxed, kept_sum, bounded);
  one_exchange(made_again, maxed, kept_sum);
  REQUIRE(made_again.size() == 2);
  CHECK(made_again[0].after == parse_placements("S(0),S(1),R"));
  CHECK(made_again[1].kind == StepKind::fill);
  CHECK(workspace_bytes<SimulatedBackend>(
            plan_redistribute_for<SimulatedBackend>(summed, split, bounded)) == 112);
  CHECK_FALSE(detail::one_exchange_plan(summed, split, PlanOptions{.allow_exchange = false}));
  // Where that is not within either, the exchange after the first source Partials are reduced
  // (detail::for_each_reducing_lead): (P(max), S(1), P(sum)) -> (S(1), S(1), S(1)) of 7x10, two
  // ops that no one exchange reduces at once; the bounded plan all-reduces mesh dim 0,
  // reduce-scatters mesh dim 2 and exchanges, 280 B on a backend that packs where the larger end
  // is 140 B. Planned for it: both Partials all-reduced, then the exchange, 140 B. The same with
  // the ops swapped.
  for (const char* from : {"P(max),S(1),P(sum)", "P(sum),S(1),P(max)"}) {
    const Layout mixed(cube, parse_placements(from), {7, 10});
    const Layout thirds(cube, parse_placements("S(1),S(1),S(1)"), {7, 10});
    CHECK(workspace_bytes<PackingBackend>(plan_redistribute(mixed, thirds, bounded)) == 280);
    CHECK_FALSE(detail::one_exchange_plan(mixed, thirds, bounded));
    const Plan led = plan_redistribute_for<PackingBackend>(mixed, thirds, bounded);
    INFO(explain(led));
    REQUIRE(led.size() == 3);
    CHECK(led[0].kind == StepKind::all_reduce);
    CHECK(led[1].kind == StepKind::all_reduce);
    CHECK(led[2].kind == StepKind::exchange);
    CHECK(led.memory_bounded());
    CHECK(led.lower_bound_bytes_recv_max() == lower_bound_bytes_recv_max(mixed, thirds));
    CHECK(workspace_bytes<PackingBackend>(led) == 140);
    CHECK(scratch_within_ends<SimulatedBackend>(led));
    const auto runs = run_strided_and_packed(led);
    check_within_ends(runs.second, mixed, thirds);
    CHECK(verified_on(led).verified);
  }
  // Where the target makes a Partial the source does not hold, the exchange may leave Replicate
  // or any S(d) there for the fill (for_each_one_exchange_plan), and every such plan is tried,
  // not only the fastest. On 3x2x2, (P(max), S(0), S(1)) -> (P(max), P(sum), S(0)) of 8x16 reduces
  // the P(max) before the P(sum) is made (the ops do not commute) and makes it again: the bounded
  // plan all-reduces, gathers and fills, 384 B on a backend that packs where the larger end is
  // 256 B; the exchange into (S(1), S(1), S(0)) and two fills hold 48 B (from the source's S(0)
  // on mesh dim 1 the fill would not be local). (P(sum), S(0), P(sum)) -> (S(1), P(max), S(0)) of
  // 7x10: the fastest exchange holds 320 B, over the larger end (280 B); the one into (S(1),
  // S(1), S(0)) and a fill, 160 B.
  const DeviceMesh slab({3, 2, 2});
  const auto exchange_then_fills = [&](const Layout& from, const Layout& to,
                                       std::int64_t bounded_bytes, std::int64_t held) {
    CHECK(workspace_bytes<PackingBackend>(plan_redistribute(from, to, bounded)) == bounded_bytes);
    const Plan p = plan_redistribute_for<PackingBackend>(from, to, bounded);
    INFO(explain(p));
    REQUIRE(p.size() >= 2);
    CHECK(p[0].kind == StepKind::exchange);
    CHECK(p[0].after == parse_placements("S(1),S(1),S(0)"));
    for (std::size_t i = 1; i < p.size(); ++i) CHECK(p[i].kind == StepKind::fill);
    CHECK(p.memory_bounded());
    CHECK(workspace_bytes<PackingBackend>(p) == held);
    CHECK(scratch_within_ends<SimulatedBackend>(p));
    const auto runs = run_strided_and_packed(p);
    check_within_ends(runs.second, from, to);
    CHECK(verified_on(p).verified);
  };
  exchange_then_fills(Layout(slab, parse_placements("P(max),S(0),S(1)"), {8, 16}),
                      Layout(slab, parse_placements("P(max),P(sum),S(0)"), {8, 16}), 384, 48);
  const Layout sums_apart(slab, parse_placements("P(sum),S(0),P(sum)"), {7, 10});
  const Layout max_inside(slab, parse_placements("S(1),P(max),S(0)"), {7, 10});
  REQUIRE(detail::one_exchange_plan(sums_apart, max_inside, bounded));
  CHECK(workspace_bytes<PackingBackend>(
            *detail::one_exchange_plan(sums_apart, max_inside, bounded)) == 320);
  exchange_then_fills(
      sums_apart, max_inside,
      workspace_bytes<PackingBackend>(plan_redistribute(sums_apart, max_inside, bounded)), 160);
  CHECK_FALSE(
      scratch_within_ends<PackingBackend>(plan_redistribute(sums_apart, max_inside, bounded)));
  CHECK(plan_redistribute_for<PackingBackend>(large_src, large_dst,
                                              PlanOptions{.memory = Memory::any}) ==
        plan_redistribute(large_src, large_dst, PlanOptions{.memory = Memory::any}));
  if (every_pair) {
    CHECK(over[0][0] == 544);    // of 31,250 (strided, plan_redistribute)
    CHECK(over[1][0] == 1'223);  // (packing)
    CHECK(over[0][1] == 0);      // planned for the backend
    CHECK(over[1][1] == 0);
    CHECK(ran == 186);
  }
}

TEST_CASE("in bf16 plan_redistribute_for plans within the ends as in f32", "[execute][memory]") {
  // A bf16 (or f16) sum folds its parts in float all at once, so an uneven reduce-scatter of it,
  // and the first round of an exchange from a Partial of it, stage every part in one round
  // where f32 folds them in rounds: under the bytes objective (S(1), P) -> (R, S(1)) on 2x4 of
  // 7x10 is one exchange from the Partial holding 84 B where the larger end is 70 B. Planned for
  // the backend, another of the bounded candidates holds the bound (the time objective's
  // all-reduce and exchange, 70 B). Every matrix pair on 2x4 and 4x2 at 8x16 and 7x10, under the
  // time objective: within the ends on both kinds of backend; the plans for a backend that
  // differ from the bounded search's own, run on both kinds, hold what was planned and reach the
  // target.
  const PlanOptions fewest{.objective = Objective::bytes, .memory = Memory::bounded};
  const DeviceMesh wide({2, 4});
  const Layout partial(wide, parse_placements("S(1),P(sum)"), {7, 10}, DType::bf16);
  const Layout gathered(wide, parse_placements("R,S(1)"), {7, 10}, DType::bf16);
  const Plan own = plan_redistribute(partial, gathered, fewest);
  INFO(explain(own));
  REQUIRE(own.size() == 1);
  CHECK(own[0].kind == StepKind::exchange);
  CHECK(workspace_bytes<SimulatedBackend>(own) == 84);
  CHECK_FALSE(scratch_within_ends<SimulatedBackend>(own));
  const Plan strided = plan_redistribute_for<SimulatedBackend>(partial, gathered, fewest);
  INFO(explain(strided));
  CHECK(strided.size() == 2);
  CHECK(workspace_bytes<SimulatedBackend>(strided) == 70);
  CHECK(strided.memory_bounded());
  check_within_ends(run_strided_and_packed(strided).first, partial, gathered);
  CHECK(verified_on(strided).verified);

  const PlanOptions bounded{.memory = Memory::bounded};

  const Placement each[] = {Placement::replicate(), Placement::shard(0), Placement::shard(1),
                            Placement::partial(ReduceOp::sum), Placement::partial(ReduceOp::max)};
  // Every exhaustive_stride()-th pair (the sanitizer preset samples): the counts need them all.
  const bool every_pair = testing::exhaustive_stride() == 1;
  int over[2] = {}, ran = 0, pairs = 0;  // the bounded search's own plans over: [packing]
  for (const char* m : {"2x4", "4x2"}) {
    const DeviceMesh grid = parse_mesh(m);
    for (const Shape& shape : {Shape{8, 16}, Shape{7, 10}})
      testing::for_each_pair(
          grid, each, [&](int, int, const Placements& from, const Placements& to) {
            const Layout a(grid, from, shape, DType::bf16);
            const Layout b(grid, to, shape, DType::bf16);
            const Plan plain = plan_redistribute(a, b, bounded);
            const Plan for_packing = plan_redistribute_for<PackingBackend>(a, b, bounded);
            const Plan for_strided = plan_redistribute_for<SimulatedBackend>(a, b, bounded);
            over[0] += scratch_within_ends<SimulatedBackend>(plain) ? 0 : 1;
            over[1] += scratch_within_ends<PackingBackend>(plain) ? 0 : 1;
            ++pairs;
            INFO(explain(for_packing));
            INFO(explain(for_strided));
            CHECK(scratch_within_ends<PackingBackend>(for_packing));
            CHECK(scratch_within_ends<SimulatedBackend>(for_strided));
            for (const auto& [p, packing] :
                 {std::pair{&for_packing, true}, std::pair{&for_strided, false}}) {
              if (*p == plain) continue;
              CHECK(p->memory_bounded());
              const auto runs = run_strided_and_packed(*p);
              check_within_ends(packing ? runs.second : runs.first, a, b);
              CHECK(verified_on(*p).verified);
              ++ran;
            }
          });
  }
  if (every_pair) {
    CHECK(pairs == 2'500);
    CHECK(over[0] == 5);   // 1 on 2x4, 4 on 4x2 (4 in f32, all on 4x2)
    CHECK(over[1] == 63);  // 31 and 32 (18 and 14 in f32)
    CHECK(ran == 68);      // each plan over on a kind of backend, replaced for it
  }
}

TEST_CASE("an exchange on a backend that packs stages in the target past its block",
          "[execute][memory]") {
  // On 2x2x2x2, 7x10 f32: the all-reduce's block is in scratch and the exchange writes its block
  // at the start of the caller's target, which only a fill or a scale follows in place. The
  // exchange's staging goes in the target past its block, and that block is not counted as
  // scratch: each rank holds its larger end, 80 B on even ranks and 60 B on odd ones (at 6ea6938
  // rank 9 held 76 B in the first and rank 5 96 B in the second, over their 60 B).
  const DeviceMesh mesh({2, 2, 2, 2});
  const PlanOptions bounded{.memory = Memory::bounded};
  const auto check = [&](const char* from, const char* to, const char* exchanged, StepKind last) {
    const Layout a(mesh, parse_placements(from), {7, 10});
    const Layout b(mesh, parse_placements(to), {7, 10});
    const Plan p = plan_redistribute_for<PackingBackend>(a, b, bounded);
    INFO(explain(p));
    REQUIRE(p.size() == 3);
    CHECK(p == plan_redistribute(a, b, bounded));
    CHECK(p[0].kind == StepKind::all_reduce);
    CHECK(p[1].kind == StepKind::exchange);
    CHECK(p[1].after == parse_placements(exchanged));
    CHECK(p[2].kind == last);
    CHECK(scratch_within_ends<PackingBackend>(p));
    CHECK(scratch_within_ends<SimulatedBackend>(p));
    CHECK(workspace_bytes<PackingBackend>(p) == 80);
    for (int r = 0; r < mesh.size(); ++r)
      CHECK(workspace_bytes<PackingBackend>(p, mesh.rank_at(r)) == (r % 2 == 0 ? 80 : 60));
    const auto runs = run_strided_and_packed(p);
    check_within_ends(runs.first, a, b);
    check_within_ends(runs.second, a, b);
    CHECK(verified_on(p).verified);
  };
  check("P(sum),S(1),R,S(0)", "S(0),S(1),P(sum),S(1)", "S(0),S(1),S(0),S(1)", StepKind::fill);
  check("R,P(sum),S(1),S(0)", "P(max),S(0),S(1),S(1)", "R,S(0),S(1),S(1)", StepKind::scale);
}

TEST_CASE("a kept Partial outside a reduction of an op it does not commute with is made again",
          "[execute][memory][planner]") {
  // Mixed Partials reduce outermost first: (P(max), P(sum), S(0)) holds the max of the sums'
  // parts, so the sum on mesh dim 1 cannot be reduced while the max on mesh dim 0 is pending,
  // though the target keeps P(max) there. The exchange candidates reduce the max too and make
  // it again: under Memory::bounded two reduce-scatters and one exchange straight into the
  // target's P(max), 256 B and 64 B of scratch, where the search took seven steps (576 B, 512 B
  // of scratch, over the larger end of 256 B).
  const DeviceMesh cube({2, 2, 2});
  const Layout src(cube, parse_placements("P(max),P(sum),S(0)"), {8, 16});
  const Layout dst(cube, parse_placements("P(max),S(1),S(1)"), {8, 16});
  const Plan plan = plan_redistribute(src, dst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 3);
  CHECK(plan[0].kind == StepKind::reduce_scatter);
  CHECK(plan[0].mesh_dim == 0);
  CHECK(plan[1].kind == StepKind::reduce_scatter);
  CHECK(plan[1].mesh_dim == 1);
  CHECK(plan[2].kind == StepKind::exchange);
  CHECK(plan[2].after == dst.placements());
  CHECK(plan.bytes_recv_max() == 256);
  CHECK(blocks_within_ends(plan));
  CHECK(workspace_bytes<SimulatedBackend>(plan) == 64);
  CHECK(scratch_within_ends<PackingBackend>(plan));
  const auto runs = run_strided_and_packed(plan);
  check_within_ends(runs.first, src, dst);
  check_within_ends(runs.second, src, dst);
  CHECK(verified_on(plan).verified);
  // The same under the bytes objective; the kept Partial is no longer kept as it is where the
  // ops commute (P(sum) inside P(sum) stays through the exchange).
  CHECK(plan_redistribute(src, dst, PlanOptions{.objective = Objective::bytes}).bytes_recv_max() ==
        256);
  const Layout sums(cube, parse_placements("P(sum),P(sum),S(0)"), {8, 16});
  const Layout kept(cube, parse_placements("P(sum),S(1),S(1)"), {8, 16});
  const Plan same_op = plan_redistribute(sums, kept, PlanOptions{.objective = Objective::bytes});
  INFO(explain(same_op));
  CHECK(std::ranges::none_of(same_op, [](const Step& s) { return s.mesh_dim == 0; }));
  CHECK(verified_on(same_op).verified);
}

TEST_CASE("under Memory::bounded, a collective that stages past the larger end runs in bands",
          "[execute][memory]") {
  // (S(1), S(1)) -> (R, R) on 2x2 all-gathers twice. On a backend that packs, the second
  // gathers the column pieces of the whole 8x16 tensor into staging (512 B) and unpacks them,
  // beside the 8x8 block it reads in scratch (256 B): 768 B, where the larger end is 512 B. In
  // bands of 4 rows it is two all-gathers of the group, each staging 256 B: 512 B.
  const DeviceMesh mesh({2, 2});
  const Layout src(mesh, parse_placements("S(1),S(1)"), {8, 16});
  const Layout dst(mesh, parse_placements("R,R"), {8, 16});
  const Plan plan = plan_redistribute(src, dst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 2);
  REQUIRE(plan[1].kind == StepKind::all_gather);
  const detail::StepContext second = detail::step_context(plan, 1, MeshCoord{0, 0}, false);
  CHECK(detail::band_rows(second, {}, false, true) == 4);
  // A backend that receives the pieces strided stages nothing; a batch runs one call per step.
  CHECK(detail::band_rows(second, detail::abilities_of<detail::Link<SimulatedBackend>>, false,
                          true) == 0);
  CHECK(detail::band_rows(second, detail::LinkAbilities{.one_call_per_step = true}, false, true) ==
        0);
  CHECK(workspace_bytes<PackingBackend>(plan) == 512);
  run_strided_and_packed(plan);
  // Without the bound, one call.
  const Plan any = plan_redistribute(src, dst);
  REQUIRE(any.steps() == plan.steps());
  CHECK(workspace_bytes<PackingBackend>(any) == 768);

  // Every pair of the matrix on 2x2 and 2x4, even and uneven, under both objectives, and padded
  // with balanced chunks (whose members stage differently: a padded piece is packed to send
  // where it is not whole): the same bits packed as strided, bytes as planned, scratch as
  // planned (run_strided_and_packed).
  const Placement letters[] = {Replicate(), Shard(0), Shard(1), Partial(), Partial(ReduceOp::max)};
  int banded = 0, runs = 0;
  for (const DeviceMesh& m : {DeviceMesh({2, 2}), DeviceMesh({2, 4})})
    testing::for_each_pair(m, letters, [&](int, int, const Placements& a, const Placements& b) {
      for (const Shape& shape : {Shape{8, 16}, Shape{7, 10}})
        for (int variant = 0; variant < 3; ++variant) {
          const ChunkPolicy policy =
              variant == 2 ? ChunkPolicy::balanced : ChunkPolicy::torch_chunk;
          const Plan p = plan_redistribute(
              Layout(m, a, shape, DType::f32, policy), Layout(m, b, shape, DType::f32, policy),
              {.objective = variant == 1 ? Objective::bytes : Objective::time,
               .padding = variant == 2 ? Padding::always : Padding::automatic,
               .memory = Memory::bounded});
          if (p.empty()) continue;
          ++runs;
          run_strided_and_packed(p);
          const MeshCoord origin(2, 0);
          if (detail::rank_workspace_bytes(p, origin, 0, {}) !=
              detail::rank_workspace_bytes(p, origin, 0, {.one_call_per_step = true}))
            ++banded;
        }
    });
  fmt::print("bands: {} of {} bounded plans run a step in bands on a packing backend\n", banded,
             runs);
  CHECK(banded > 100);
}

namespace {

// Runs `plan` through execute_async on a backend that packs (detail::RunOnRanks).
void run_async_on_packing(const Plan& plan, std::vector<std::vector<float>>& in,
                          std::vector<std::vector<float>>& out, std::vector<RankBytes>& measured) {
  const DeviceMesh& mesh = plan.src().mesh();
  SimulatedWorld& world = world_of(mesh);
  world.run([&](SimulatedBackend& b) {
    const auto i = static_cast<std::size_t>(mesh.index_of(b.rank()));
    PackingBackend p(b);
    execute_async(plan, p, in[i].data(), in[i].size() * sizeof(float), out[i].data(),
                  out[i].size() * sizeof(float))
        .wait();
  });
  for (int i = 0; i < mesh.size(); ++i) measured.push_back(world.bytes(mesh.rank_at(i)));
}

// `plan` (f32) run through execute_async on a backend that packs, checked against the global
// view and the planned bytes: execute_async fails where a run starts more operations than
// link_operations counts.
void run_async_packed(const Plan& plan) {
  const Verification v = detail::verify_typed<float>(plan, &run_async_on_packing);
  CHECK(v.difference == "");
  CHECK(v.verified);
}

// The plans a sweep makes of every pair of the matrix on 2x2 and 2x4 (testing::for_each_pair):
// each pair at every shape, objective, memory mode and dtype listed here.
struct Sweep {
  std::vector<Shape> shapes{{8, 16}, {7, 10}};
  std::vector<Memory> memories{Memory::bounded};
  std::vector<DType> dtypes{DType::f32};
};

// Runs every plan of `sweep` that `selects` on the simulator, strided and packed
// (run_strided_and_packed: the same bits, bytes and scratch as planned), and in f32 through
// execute_async on a backend that packs; returns how many it ran. The plans selected are few
// and close together: where the pairs are sampled, at most every 5th (some of each kind).
template <class Selects>
int run_selected_plans(const Sweep& sweep, Selects&& selects) {
  const Placement letters[] = {Replicate(), Shard(0), Shard(1), Partial(), Partial(ReduceOp::max)};
  const int stride = std::min(testing::exhaustive_stride(), 5);
  int selected = 0;
  for (const DeviceMesh& m : {DeviceMesh({2, 2}), DeviceMesh({2, 4})}) {
    auto run_pair = [&](int, int, const Placements& a, const Placements& b) {
      for (const Shape& shape : sweep.shapes)
        for (const Objective objective : {Objective::time, Objective::bytes})
          for (const Memory memory : sweep.memories)
            for (const DType dtype : sweep.dtypes) {
              const Plan q =
                  plan_redistribute(Layout(m, a, shape, dtype), Layout(m, b, shape, dtype),
                                    {.objective = objective, .memory = memory});
              if (!selects(q)) continue;
              ++selected;
              INFO(explain(q));
              run_strided_and_packed(q);
              if (dtype == DType::f32) run_async_packed(q);
            }
    };
    testing::for_each_pair(m, letters, run_pair, stride);
  }
  return selected;
}

// Whether `holds(i, me)` for some step i of `plan` of kind `kind` on some rank `me`.
template <class Holds>
bool on_some_rank(const Plan& plan, StepKind kind, Holds&& holds) {
  const DeviceMesh& mesh = plan.src().mesh();
  for (std::size_t i = 0; i < plan.size(); ++i)
    for (int r = 0; r < mesh.size() && plan[i].kind == kind; ++r)
      if (holds(i, mesh.coordinate_at(r))) return true;
  return false;
}

}  // namespace

TEST_CASE("under Memory::bounded, an exchange that stages past the larger end runs in rounds",
          "[execute][memory]") {
  // (S(0), S(1)) -> (S(1), R) on 2x4, 7x10 f32 is one exchange. Its pieces are column pieces of
  // the rows each rank holds: a backend that packs stages every piece it sends and receives in
  // one round, past the larger of a rank's blocks (268 B on rank 1, whose target is 140 B). In one
  // round per shift s (rank me sends rank me + s its pieces and receives rank me - s's) it stages
  // one round's: 80 B at most.
  const DeviceMesh mesh({2, 4});
  const Layout src(mesh, parse_placements("S(0),S(1)"), {7, 10});
  const Layout dst(mesh, parse_placements("S(1),R"), {7, 10});
  const Plan plan = plan_redistribute(src, dst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 1);
  REQUIRE(plan[0].kind == StepKind::exchange);
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  const std::vector<int> shifts = detail::exchange_shifts(plan, plan[0], packs);
  CHECK(shifts == std::vector<int>{1, 2, 3, 4, 5, 6, 7});
  // A batch runs one call per step: one round.
  CHECK(detail::exchange_shifts(plan, plan[0], {.one_call_per_step = true}).empty());
  const auto [strided, packed] = run_strided_and_packed(plan);
  // A backend that moves strided pieces stages nothing: one round.
  CHECK(strided.collectives == 1);
  CHECK(packed.collectives == 7);
  bool one_round_over = false;
  for (int i = 0; i < mesh.size(); ++i) {
    const auto u = static_cast<std::size_t>(i);
    const int rank = mesh.rank_at(i);
    const std::int64_t ends = std::max(src.local_bytes(rank), dst.local_bytes(rank));
    CHECK(packed.scratch_peak[u] <= ends);
    CHECK(strided.scratch_peak[u] == 0);
    // In one round (as a batch runs it): over on some rank.
    one_round_over =
        one_round_over || detail::rank_workspace_bytes(plan, mesh.coordinate_at(i), 0,
                                                       {.one_call_per_step = true}) > ends;
  }
  CHECK(one_round_over);
  CHECK(workspace_bytes<PackingBackend>(plan) == 80);
  CHECK(detail::workspace_bytes(plan, 0, {.one_call_per_step = true}) == 268);
  // execute_async counts each round as an operation (link_operations).
  CHECK(detail::link_operations(plan, packs) == 7);
  run_async_packed(plan);

  // An exchange from a Partial delivers its reduced parts the same way: (P, S(1)) -> (R, S(0))
  // under the bytes objective reduces each pair's parts in one round, then sends every rank the
  // rows of its target, one round per shift.
  const Layout psrc(mesh, parse_placements("P,S(1)"), {7, 10});
  const Layout pdst(mesh, parse_placements("R,S(0)"), {7, 10});
  const Plan reducing = plan_redistribute(
      psrc, pdst, PlanOptions{.objective = Objective::bytes, .memory = Memory::bounded});
  INFO(explain(reducing));
  REQUIRE(reducing.size() == 1);
  REQUIRE(detail::exchange_reduces(reducing[0].before, reducing[0].after));
  const MeshCoord origin(2, 0);
  CHECK(detail::delivery_shifts(detail::step_context(reducing, 0, origin, false), packs).size() ==
        7);
  CHECK(detail::link_operations(reducing, packs) == 1 + 7);
  check_within_ends(run_strided_and_packed(reducing).second, psrc, pdst);
  run_async_packed(reducing);

  // Every bounded plan whose exchanges run in rounds runs through execute_async in the next
  // test case's matrix.
}

TEST_CASE("the shifts of a step's rounds are decided once per process", "[execute][memory]") {
  // Deciding an exchange's rounds weighs every rank's pieces; the answer depends on the plan, the
  // step and the link alone, and is remembered: a second call, on any rank or thread, takes it.
  using detail::RoundsKey;
  auto& memo = detail::round_shifts_memo<RoundsKey>();
  const DeviceMesh mesh({2, 4});
  const Plan plan = plan_redistribute(Layout(mesh, parse_placements("S(0),S(1)"), {7, 10}),
                                      Layout(mesh, parse_placements("S(1),R"), {7, 10}),
                                      {.memory = Memory::bounded});
  REQUIRE(plan.size() == 1);
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  constexpr auto strided = detail::abilities_of<detail::Link<SimulatedBackend>>;
  const std::vector<int> all{1, 2, 3, 4, 5, 6, 7};
  CHECK(detail::exchange_shifts(plan, plan[0], packs) == all);
  int computed = 0;
  auto count = [&computed] {
    ++computed;
    return std::vector<int>{};
  };
  CHECK(memo.get(plan, plan[0], RoundsKey{packs, false}, count) == all);
  CHECK(computed == 0);
  // Another link, or the same step's delivery, is another question.
  CHECK(detail::exchange_shifts(plan, plan[0], strided).empty());
  CHECK(memo.get(plan, plan[0], RoundsKey{packs, true}, count).empty());
  CHECK(computed == 1);
  // Another memo, keyed by an int: the oldest of more than `capacity` answers is computed again.
  detail::RoundShiftsMemo<int> local;
  computed = 0;
  for (int i = 0; i <= static_cast<int>(decltype(local)::capacity); ++i)
    local.get(plan, plan[0], i, count);
  CHECK(computed == 9);
  local.get(plan, plan[0], 8, count);
  CHECK(computed == 9);
  local.get(plan, plan[0], 0, count);
  CHECK(computed == 10);
  // Eight ranks asking at once: one computes, the others take its answer.
  std::atomic<int> runs{0};
  std::vector<std::thread> ranks;
  std::vector<std::vector<int>> answers(8);
  for (std::size_t r = 0; r < answers.size(); ++r)
    ranks.emplace_back([&, r] {
      answers[r] = local.get(plan, plan[0], 100, [&] {
        ++runs;
        return detail::exchange_shifts(plan, plan[0], packs);
      });
    });
  for (std::thread& t : ranks) t.join();
  CHECK(runs == 1);
  for (const std::vector<int>& a : answers) CHECK(a == all);
}

TEST_CASE("under Memory::bounded, an exchange whose rounds stage past the larger end runs in bands",
          "[execute][memory]") {
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  // (S(1), P) -> (R, S(1)) on 2x2, 1023x2046 f32: a reduce-scatter into column pieces of 1023 and
  // 1022, then an exchange that gathers every rank's target columns. Rank 2 keeps its 1023
  // columns' block (2,095,104 B) in scratch while it receives rank 0's, packed: one piece per
  // round is 2,095,104 B, past its 4,186,116 B blocks. Each round moves its pieces in two bands
  // of rows, both sides cutting a piece alike: half the staging.
  const DeviceMesh mesh({2, 2});
  const Layout src(mesh, parse_placements("S(1),P"), {1023, 2046});
  const Layout dst(mesh, parse_placements("R,S(1)"), {1023, 2046});
  const Plan plan = plan_redistribute(src, dst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 2);
  REQUIRE(plan[1].kind == StepKind::exchange);
  const std::vector<int> shifts = detail::exchange_shifts(plan, plan[1], packs);
  CHECK(shifts == std::vector<int>{1, 2, 3});
  CHECK(detail::exchange_bands(plan, plan[1], packs) == 2);
  const MeshCoord two = mesh.coordinate(2);
  detail::ExchangeWay rounds = detail::exchange_pieces(plan, plan[1], two, false);
  detail::stage_in_rounds(rounds, shifts, mesh, two, 4);
  const std::int64_t block = src.local_box(plan[1].before, two).numel() * 4;
  CHECK(block == 1023 * 512 * 4);
  const std::int64_t ends = std::max(src.local_bytes(2), dst.local_bytes(2));
  CHECK(block + static_cast<std::int64_t>(rounds.send + rounds.recv) > ends);
  const detail::ExchangeWay banded =
      detail::exchange_way(detail::step_context(plan, 1, two, false), packs);
  CHECK(banded.bands == 2);
  CHECK(banded.recv == 512 * 512 * 4);  // 512 of the 1023 rows of rank 0's 512 columns
  // A strided link stages nothing: one round, no bands.
  CHECK(detail::exchange_shifts(plan, plan[1], detail::abilities_of<detail::Link<SimulatedBackend>>)
            .empty());
  CHECK(detail::link_operations(plan, packs) == 1 + 3 * 2);
  const auto [strided, packed] = run_strided_and_packed(plan);
  CHECK(packed.collectives == 1 + 3 * 2);  // a reduce-scatter, then 6 rounds
  check_within_ends(packed, src, dst);
  CHECK(workspace_bytes<PackingBackend>(plan) == 3'143'680);
  run_async_packed(plan);

  // (P, S(1)) -> (S(1), S(0)) on 2x4, 7x10 f32: its exchange's pieces are a few elements of rows
  // and columns, packed; in bands of one row each lies in place.
  const Layout psrc(DeviceMesh({2, 4}), parse_placements("P,S(1)"), {7, 10});
  const Layout pdst(DeviceMesh({2, 4}), parse_placements("S(1),S(0)"), {7, 10});
  const Plan small = plan_redistribute(psrc, pdst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(small));
  REQUIRE(small.size() == 2);
  REQUIRE(small[1].kind == StepKind::exchange);
  CHECK(detail::exchange_bands(small, small[1], packs) == 2);
  CHECK(detail::link_operations(small, packs) == 1 + 7 * 2);
  check_within_ends(run_strided_and_packed(small).second, psrc, pdst);
  run_async_packed(small);

  // The delivery of an exchange from a Partial alike: (P, S(0)) -> (R, S(1)) on 2x2, 7x10 f32,
  // fewest bytes, reduces each pair's rows, then delivers them in 3 rounds. Rank 3 packs 60 B
  // of rows to send in one round beside the 84 B its reduction stages: 144 B, past its 140 B
  // target. In two bands per round it packs 40 B: 124 B.
  const Layout rsrc(mesh, parse_placements("P,S(0)"), {7, 10});
  const Layout rdst(mesh, parse_placements("R,S(1)"), {7, 10});
  const Plan reducing = plan_redistribute(
      rsrc, rdst, PlanOptions{.objective = Objective::bytes, .memory = Memory::bounded});
  INFO(explain(reducing));
  REQUIRE(reducing.size() == 1);
  REQUIRE(detail::exchange_reduces(reducing[0].before, reducing[0].after));
  const MeshCoord three = mesh.coordinate(3);
  const detail::StepContext at_three = detail::step_context(reducing, 0, three, false);
  const std::vector<int> deliveries = detail::delivery_shifts(at_three, packs);
  CHECK(deliveries.size() == 3);
  CHECK(detail::delivery_bands(at_three, packs) == 2);
  detail::ReducingExchangeWay one_band = detail::reducing_exchange_pieces(at_three, packs);
  detail::stage_in_rounds(one_band.deliver, deliveries, mesh, three, 4);
  one_band.size_staging(one_band.recv);
  CHECK(one_band.allocated() == 144);
  CHECK(detail::reducing_exchange_way(at_three, packs).allocated() == 124);
  CHECK(detail::link_operations(reducing, packs) == 1 + 3 * 2);
  check_within_ends(run_strided_and_packed(reducing).second, rsrc, rdst);
  run_async_packed(reducing);
}

TEST_CASE("every bounded plan whose exchange runs its rounds in bands runs as planned",
          "[execute][memory]") {
  // The pairs of the matrix on 2x2 and 2x4 whose exchange, or exchange from a Partial's
  // delivery, runs its rounds in bands on a packing backend: the same bits packed as strided,
  // bytes and scratch as planned, and through execute_async.
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  const int banded = run_selected_plans(Sweep{}, [&](const Plan& q) {
    return on_some_rank(q, StepKind::exchange, [&](std::size_t i, const MeshCoord& me) {
      return detail::exchange_reduces(q[i].before, q[i].after)
                 ? detail::delivery_bands(detail::step_context(q, i, me, false), packs) > 1
                 : detail::exchange_bands(q, q[i], packs) > 1;
    });
  });
  fmt::print("exchange bands: {} bounded plans on 2x2 and 2x4\n", banded);
  CHECK(banded >= (testing::exhaustive_stride() == 1 ? 10 : 1));
}

TEST_CASE("an exchange from a Partial in rounds packs its partials in its own round",
          "[execute][memory]") {
  // (S(0), P) -> (S(1), S(1)) on 2x4, 7x10 f32, fewest bytes, bounded: one exchange from a
  // Partial whose groups of 4 reduce their parts in 4 rounds, one per member. Rank 2 packs its
  // partials of the 3 other members' column parts (112 B), which go out in its own round, and
  // receives each other round's partial into a slot of 48 B: packed in its round, they lie under
  // that slot, 112 B where both side by side took 160 B, past its 160 B blocks with the 48 B
  // reduced part.
  const DeviceMesh mesh({2, 4});
  const Layout src(mesh, parse_placements("S(0),P"), {7, 10});
  const Layout dst(mesh, parse_placements("S(1),S(1)"), {7, 10});
  const Plan plan = plan_redistribute(
      src, dst, PlanOptions{.objective = Objective::bytes, .memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 1);
  REQUIRE(detail::exchange_reduces(plan[0].before, plan[0].after));
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  const detail::ReducingExchangeWay w = detail::reducing_exchange_way(
      detail::step_context(plan, 0, mesh.coordinate(2), false), packs);
  CHECK(w.rounds);
  CHECK(w.packed == 112);
  CHECK(w.part_bytes == 48);
  CHECK(w.send == 112);
  CHECK(w.recv == 48);
  CHECK(workspace_bytes<PackingBackend>(plan) == 160);
  check_within_ends(run_strided_and_packed(plan).second, src, dst);
  run_async_packed(plan);
}

TEST_CASE("under Memory::bounded, a reduce-scatter that packs its pieces packs one per round",
          "[execute][memory]") {
  // P -> S(1) on 4 ranks, 7x10 f32: column pieces of 3, 3, 3 and 1, reduced by point-to-point
  // messages (uneven). In one round a backend that packs stages the other members' pieces and 2
  // partials of its own, its own folded through those pieces after the round (364 B on ranks 0
  // to 2, whose larger block is the 280 B source); in 3 rounds, one piece packed and one partial
  // received at a time, folded into the target after its round: 168 B. A backend that sends strided
  // pieces where they lie keeps one round from the caller's source (it would stage as much in
  // rounds).
  const DeviceMesh mesh({4});
  const Layout src(mesh, parse_placements("P"), {7, 10});
  const Layout dst(mesh, parse_placements("S(1)"), {7, 10});
  const Plan plan = plan_redistribute(src, dst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 1);
  REQUIRE(plan[0].kind == StepKind::reduce_scatter);
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  constexpr auto strided = detail::abilities_of<detail::Link<SimulatedBackend>>;
  CHECK(detail::packs_in_rounds(plan, plan[0], packs));
  CHECK_FALSE(detail::packs_in_rounds(plan, plan[0], strided));
  CHECK(detail::link_operations(plan, packs) == 3);
  CHECK(detail::link_operations(plan, strided) == 1);
  CHECK(workspace_bytes<PackingBackend>(plan) == 168);
  CHECK(detail::workspace_bytes(plan, 0, {.one_call_per_step = true}) == 364);
  const auto [s, p] = run_strided_and_packed(plan);
  CHECK(s.collectives == 1);
  CHECK(p.collectives == 3);
  check_within_ends(p, src, dst);
  run_async_packed(plan);
  // bf16 sums accumulate in float: folded one at a time they would round at every part, so they
  // keep one round; max folds in any type.
  for (const DType dtype : {DType::bf16, DType::f32}) {
    const ReduceOp op = dtype == DType::bf16 ? ReduceOp::sum : ReduceOp::max;
    const Plan other = plan_redistribute(Layout(mesh, {Partial(op)}, {7, 10}, dtype),
                                         Layout(mesh, {Shard(1)}, {7, 10}, dtype),
                                         PlanOptions{.memory = Memory::bounded});
    CHECK(detail::link_operations(other, packs) == (dtype == DType::bf16 ? 1 : 3));
    CHECK(verified_on(other).verified);
    run_strided_and_packed(other);
  }

  // Every bounded plan of the matrix on 4, 2x2 and 2x4 that runs a step in several calls on a
  // backend that packs (bands, rounds), through execute_async: as many operations as counted,
  // the global view.
  const Placement letters[] = {Replicate(), Shard(0), Shard(1), Partial(), Partial(ReduceOp::max)};
  int several = 0;
  for (const DeviceMesh& m : {DeviceMesh({4}), DeviceMesh({2, 2}), DeviceMesh({2, 4})})
    testing::for_each_pair(m, letters, [&](int, int, const Placements& a, const Placements& b) {
      for (const Shape& shape : {Shape{8, 16}, Shape{7, 10}})
        for (const Objective objective : {Objective::time, Objective::bytes}) {
          const Plan q = plan_redistribute(Layout(m, a, shape), Layout(m, b, shape),
                                           {.objective = objective, .memory = Memory::bounded});
          if (detail::link_operations(q, packs) ==
              detail::link_operations(q, {.one_call_per_step = true}))
            continue;
          ++several;
          INFO(explain(q));
          run_async_packed(q);
        }
    });
  fmt::print("several calls: {} bounded plans run a step in several calls on a packing backend\n",
             several);
  CHECK(several * testing::exhaustive_stride() > 100);
}

TEST_CASE("an all-to-all that packs past the larger end runs by peers or receives into its block",
          "[execute][memory]") {
  // (R, S(0)) -> (S(0), S(1)) on 2x4, 8x16 f32: an all-to-all over 4 members into an 8x4 block in
  // scratch (128 B, the larger end), then a chunk of its rows. On a backend that packs, one call
  // packs the source's 4 column pieces (128 B, more than the target's 64 B of room) beside that
  // block: 256 B. By peers, the own piece copied, then one piece packed per round into the
  // target's room: 128 B.
  const DeviceMesh mesh({2, 4});
  const Layout src(mesh, parse_placements("R,S(0)"), {8, 16});
  const Layout dst(mesh, parse_placements("S(0),S(1)"), {8, 16});
  const Plan plan = plan_redistribute(src, dst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 2);
  REQUIRE(plan[0].kind == StepKind::all_to_all);
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  constexpr auto strided = detail::abilities_of<detail::Link<SimulatedBackend>>;
  CHECK(detail::all_to_all_by_peers(plan, plan[0], packs));
  // A backend that moves strided pieces stages nothing; a batch runs one call per step.
  CHECK_FALSE(detail::all_to_all_by_peers(plan, plan[0], strided));
  CHECK_FALSE(detail::all_to_all_by_peers(plan, plan[0], {.one_call_per_step = true}));
  // Without the bound, one call.
  const Plan any = plan_redistribute(src, dst, PlanOptions{.memory = Memory::any});
  REQUIRE(any.steps() == plan.steps());
  CHECK_FALSE(detail::all_to_all_by_peers(any, any[0], packs));
  CHECK(workspace_bytes<PackingBackend>(any) == 256);
  CHECK(workspace_bytes<PackingBackend>(plan) == 128);
  // execute_async counts each round as an operation (link_operations).
  CHECK(detail::link_operations(plan, packs) == 3);
  CHECK(detail::link_operations(plan, strided) == 1);
  check_within_ends(run_strided_and_packed(plan).second, src, dst);
  run_async_packed(plan);

  // (S(0), R) -> (S(1), S(0)) on 2x4, 8x16 f32: an all-to-all over a pair into an 8x8 block in
  // scratch (256 B, the larger end), then a chunk of its rows. The piece it sends is 4 rows of
  // 8 columns of the source, packed; the piece it receives, 4 whole rows of the block. The own
  // piece's 4 rows of the block stage the packed piece, and are copied after the round: 256 B,
  // where a slot beside the block took 384 B.
  const Layout osrc(mesh, parse_placements("S(0),R"), {8, 16});
  const Layout odst(mesh, parse_placements("S(1),S(0)"), {8, 16});
  const Plan own_slab = plan_redistribute(osrc, odst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(own_slab));
  REQUIRE(own_slab.size() == 2);
  REQUIRE(own_slab[0].kind == StepKind::all_to_all);
  CHECK(detail::all_to_all_by_peers(own_slab, own_slab[0], packs));
  const detail::AllToAllWay sends =
      detail::all_to_all_way(detail::step_context(own_slab, 0, MeshCoord{0, 0}, false), packs);
  CHECK(sends.send_in_own_slab);
  CHECK(sends.allocated() == 0);
  CHECK(workspace_bytes<PackingBackend>(own_slab) == 256);
  check_within_ends(run_strided_and_packed(own_slab).second, osrc, odst);
  run_async_packed(own_slab);

  // (S(0), S(1)) -> (R, S(0)) on 2x4 all-gathers rows into an 8x4 block in scratch (128 B, the
  // larger end), then all-to-alls its row pieces into column pieces of the 2x16 target. One call
  // stages the 4 received pieces (128 B) beside the block; by peers, each piece is received into
  // the own piece's slab of the block (copied out first) and unpacked from there: nothing staged.
  const Layout gsrc(mesh, parse_placements("S(0),S(1)"), {8, 16});
  const Layout gdst(mesh, parse_placements("R,S(0)"), {8, 16});
  const Plan slots = plan_redistribute(gsrc, gdst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(slots));
  REQUIRE(slots.size() == 2);
  REQUIRE(slots[1].kind == StepKind::all_to_all);
  CHECK(detail::all_to_all_by_peers(slots, slots[1], packs));
  detail::StepContext second = detail::step_context(slots, 1, MeshCoord{0, 0}, false);
  second.block_writable = true;
  const detail::AllToAllWay way = detail::all_to_all_way(second, packs);
  CHECK(way.by_peers);
  CHECK(way.into_slots);
  CHECK(way.allocated() == 0);
  CHECK(workspace_bytes<PackingBackend>(slots) == 128);
  const Plan slots_any = plan_redistribute(gsrc, gdst, PlanOptions{.memory = Memory::any});
  REQUIRE(slots_any.steps() == slots.steps());
  CHECK(workspace_bytes<PackingBackend>(slots_any) == 256);
  CHECK(detail::link_operations(slots, packs) == 1 + 3);
  run_strided_and_packed(slots);
  run_async_packed(slots);

  // An exact all-to-all (uneven pieces, one round) receives a piece into the own piece's slab of
  // a block it may overwrite. (P, S(1)) -> (R, S(0)) on 2x2, 7x10 f32 all-reduces into a 7x5
  // block in scratch (140 B), then all-to-alls its row pieces (4 and 3 rows) into column pieces
  // of the target. Rank 1 (a 3x10 target; its larger end is the 140 B source) staged the 3x5
  // piece it receives beside the block, 200 B; received into its own piece's slab, 140 B.
  const DeviceMesh square({2, 2});
  const Layout psrc(square, parse_placements("P,S(1)"), {7, 10});
  const Layout pdst(square, parse_placements("R,S(0)"), {7, 10});
  const Plan exact = plan_redistribute(psrc, pdst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(exact));
  REQUIRE(exact.size() == 2);
  REQUIRE(exact[1].kind == StepKind::all_to_all);
  detail::StepContext rank1 = detail::step_context(exact, 1, MeshCoord{0, 1}, false);
  REQUIRE_FALSE(rank1.even);
  CHECK(detail::all_to_all_way(rank1, packs).allocated() == 60);
  rank1.block_writable = true;
  const detail::AllToAllWay into_block = detail::all_to_all_way(rank1, packs);
  CHECK(into_block.into_own_slab == 0);
  CHECK(into_block.allocated() == 0);
  CHECK(workspace_bytes<PackingBackend>(exact) == 140);
  check_within_ends(run_strided_and_packed(exact).second, psrc, pdst);
  run_async_packed(exact);

  // By peers in place: (R, S(1), R) -> (S(2), S(2), S(1)) on 2x2x2, 4x8x8 f32 runs an
  // all-to-all whose pieces are slabs of neither its block nor its target on the scratch of the
  // block before, every piece packed out of it first (where its pieces are slabs of one of them,
  // a block of its own holds no more).
  const DeviceMesh cube({2, 2, 2});
  const Plan in_place =
      plan_redistribute(Layout(cube, parse_placements("R,S(1),R"), {4, 8, 8}),
                        Layout(cube, parse_placements("S(2),S(2),S(1)"), {4, 8, 8}),
                        PlanOptions{.memory = Memory::bounded});
  INFO(explain(in_place));
  std::uint32_t a2a = 0;
  for (std::size_t i = 0; i < in_place.size(); ++i)
    a2a |= detail::all_to_all_by_peers(in_place, in_place[i], packs) ? 1u << i : 0u;
  REQUIRE(a2a != 0);
  CHECK((detail::place_blocks(in_place, MeshCoord{0, 0, 0}, 0, packs).reuses & a2a) != 0);
  run_strided_and_packed(in_place);
  run_async_packed(in_place);

  // Every bounded plan on 2x2x2 with an all-to-all by peers: the same bits packed as strided,
  // bytes and scratch as planned, and through execute_async.
  const Placement letters[] = {Replicate(), Shard(0), Shard(1), Partial(), Partial(ReduceOp::max)};
  int by_peers = 0;
  testing::for_each_pair(cube, letters, [&](int, int, const Placements& a, const Placements& b) {
    for (const Objective objective : {Objective::time, Objective::bytes}) {
      const Plan q = plan_redistribute(Layout(cube, a, {8, 16}), Layout(cube, b, {8, 16}),
                                       {.objective = objective, .memory = Memory::bounded});
      if (std::none_of(q.begin(), q.end(), [&](const Step& step) {
            return detail::all_to_all_by_peers(q, step, packs);
          }))
        continue;
      ++by_peers;
      INFO(explain(q));
      run_strided_and_packed(q);
      run_async_packed(q);
    }
  });
  CHECK(by_peers * testing::exhaustive_stride() > 1000);
}

TEST_CASE("a reduce-scatter over a pair packs its pieces in its block", "[execute][memory]") {
  // (S(1), P) -> (S(0), S(1)) on 2x2, 8x16 f32: an all-to-all into a 4x16 block of Partials in
  // scratch (256 B, the larger end), then a reduce-scatter of its column halves over a pair. A
  // backend that packs put the halves one after the other in staging beside the block: 512 B.
  // Packed in the block itself (the target holding one half meanwhile): 256 B.
  const DeviceMesh square({2, 2});
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  const Layout src(square, parse_placements("S(1),P"), {8, 16});
  const Layout dst(square, parse_placements("S(0),S(1)"), {8, 16});
  const Plan plan = plan_redistribute(src, dst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 2);
  REQUIRE(plan[1].kind == StepKind::reduce_scatter);
  detail::StepContext second = detail::step_context(plan, 1, MeshCoord{0, 0}, false);
  CHECK_FALSE(detail::scatter_way(second).pack_in_block);  // the block may be the source's
  CHECK(detail::scatter_way(second).allocated() == 256);
  second.block_writable = true;
  CHECK(detail::scatter_way(second).pack_in_block);
  CHECK(detail::scatter_way(second).allocated() == 0);
  CHECK(workspace_bytes<PackingBackend>(plan) == 256);
  // Without the bound, packed in staging; a strided backend packs too (a native collective).
  const Plan any = plan_redistribute(src, dst, PlanOptions{.memory = Memory::any});
  REQUIRE(any.steps() == plan.steps());
  CHECK(workspace_bytes<PackingBackend>(any) == 512);
  CHECK(detail::link_operations(plan, packs) == 2);
  CHECK(verified_on(plan).verified);
  check_within_ends(run_strided_and_packed(plan).second, src, dst);
  run_async_packed(plan);

  // Rows that are no power of two (a last batch shorter than the others), a 3-D tensor (runs of
  // several elements along the inner dim), every dtype, and the Partial's ops.
  for (const Shape& shape : {Shape{12, 8}, Shape{10, 6}, Shape{6, 8, 3}, Shape{2, 4}})
    for (const DType dtype : {DType::f32, DType::bf16, DType::i64, DType::f64})
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        const Layout s(square, {Shard(1), Partial(op)}, shape, dtype);
        const Layout d(square, {Shard(0), Shard(1)}, shape, dtype);
        const Plan q = plan_redistribute(s, d, PlanOptions{.memory = Memory::bounded});
        INFO(explain(q));
        CHECK(verified_on(q).verified);
        const auto runs = run_strided_and_packed(q);
        check_within_ends(runs.second, s, d);
        if (dtype == DType::f32) run_async_packed(q);
      }

  // Every bounded plan on 2x2 and 2x4 with a reduce-scatter over a pair that would pack its
  // pieces in a block it may overwrite (after the first step): the same bits packed as
  // strided, bytes and scratch as planned, and through execute_async.
  const int in_block = run_selected_plans({.shapes = {{8, 16}}}, [](const Plan& q) {
    return on_some_rank(q, StepKind::reduce_scatter, [&](std::size_t i, const MeshCoord& me) {
      detail::StepContext c = detail::step_context(q, i, me, false);
      c.block_writable = true;
      return i > 0 && detail::scatter_way(c).pack_in_block;
    });
  });
  fmt::print("packed in the block: {} bounded plans on 2x2 and 2x4\n", in_block);
  CHECK(in_block * testing::exhaustive_stride() > 10);
}

TEST_CASE("an exchange stages in the room of the own piece it copies last", "[execute][memory]") {
  // (P, S(1)) -> (S(1), S(1)) on 2x2, 8x16 f32: an all-reduce into an 8x8 block in scratch
  // (256 B, the larger end), then an exchange to 8x4 column pieces. Rank 0 keeps its whole
  // target from its block and sends the other 8x4 columns to rank 1, packed: 128 B of staging
  // beside the block, 384 B. Its own piece copied after the round, the target holds the packed
  // columns until then: 256 B.
  const DeviceMesh square({2, 2});
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  const Layout src(square, parse_placements("P,S(1)"), {8, 16});
  const Layout dst(square, parse_placements("S(1),S(1)"), {8, 16});
  const Plan plan = plan_redistribute(src, dst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 2);
  REQUIRE(plan[1].kind == StepKind::exchange);
  const detail::ExchangeWay way =
      detail::exchange_way(detail::step_context(plan, 1, MeshCoord{0, 0}, false), packs);
  CHECK(way.own_room);
  CHECK(way.send == 128);
  CHECK(way.allocated() == 0);
  CHECK(workspace_bytes<PackingBackend>(plan) == 256);
  CHECK(verified_on(plan).verified);
  check_within_ends(run_strided_and_packed(plan).second, src, dst);
  run_async_packed(plan);

  // Every bounded plan on 2x2 and 2x4 whose exchange stages in the own piece's room on some
  // rank: the same bits packed as strided, bytes and scratch as planned, and through
  // execute_async.
  const int own_room = run_selected_plans({}, [&](const Plan& q) {
    return on_some_rank(q, StepKind::exchange, [&](std::size_t i, const MeshCoord& me) {
      return !detail::exchange_reduces(q[i].before, q[i].after) &&
             detail::exchange_way(detail::step_context(q, i, me, false), packs).own_room;
    });
  });
  fmt::print("own room: {} bounded plans on 2x2 and 2x4 stage an exchange in it\n", own_room);
  CHECK(own_room * testing::exhaustive_stride() > 10);
}

TEST_CASE("an exchange from a Partial stages its first round in its target", "[execute][memory]") {
  // (P, S(1)) -> (R, S(0)) on 2x2, 8x16 f32, fewest bytes: one exchange from the Partial. Rank
  // 0 reduces the 8x4 columns 0-3 of its 8x8 block from its partial and rank 2's, then sends the
  // reduced rows on. On a packing backend its first round packs its partial of rank 2's columns
  // (128 B) and stages rank 2's partial of its own (128 B) beside the reduced part and the
  // second round's pieces: 448 B, past the larger end (256 B). The packed partial is dead before
  // the second round writes the 4x16 target, so it lies there; rank 2's partial comes into the
  // reduced part's slot, and rank 0's own is copied into the target after the round and reduced
  // from there (one band of all 8 rows): 192 B.
  const DeviceMesh square({2, 2});
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  const Layout src(square, parse_placements("P,S(1)"), {8, 16});
  const Layout dst(square, parse_placements("R,S(0)"), {8, 16});
  const Plan plan = plan_redistribute(
      src, dst, PlanOptions{.objective = Objective::bytes, .memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 1);
  REQUIRE(plan[0].kind == StepKind::exchange);
  const detail::ReducingExchangeWay way =
      detail::reducing_exchange_way(detail::step_context(plan, 0, MeshCoord{0, 0}, false), packs);
  CHECK(way.packed == 128);
  CHECK(way.first_round_in_target == 128);
  CHECK(way.own_in_bands);
  CHECK(way.band_rows == 8);
  CHECK(way.allocated() == 192);
  CHECK(workspace_bytes<PackingBackend>(plan) == 192);
  CHECK(verified_on(plan).verified);
  check_within_ends(run_strided_and_packed(plan).second, src, dst);
  run_async_packed(plan);

  // (S(0), P) -> (R, S(1)) on 2x4, 7x10: the first round in rounds over 4 members; on rank 0
  // only the first of the 3 packed partials fits in its 7x3 target, the others are staged.
  const DeviceMesh wide({2, 4});
  const Plan rounds =
      plan_redistribute(Layout(wide, parse_placements("S(0),P"), {7, 10}),
                        Layout(wide, parse_placements("R,S(1)"), {7, 10}),
                        PlanOptions{.objective = Objective::bytes, .memory = Memory::bounded});
  INFO(explain(rounds));
  REQUIRE(rounds.size() == 1);
  const detail::ReducingExchangeWay partly =
      detail::reducing_exchange_way(detail::step_context(rounds, 0, MeshCoord{0, 0}, false), packs);
  CHECK(partly.rounds);
  CHECK(partly.first_round_in_target > 0);
  CHECK(partly.first_round_in_target < partly.packed);
  run_strided_and_packed(rounds);
  run_async_packed(rounds);

  // Every plan on 2x2 and 2x4 whose exchange from a Partial stages some of its first round in
  // the target on some rank, bounded or not: the same bits packed as strided, bytes and
  // scratch as planned, and through execute_async.
  const int in_target =
      run_selected_plans({.memories = {Memory::any, Memory::bounded}}, [&](const Plan& q) {
        return on_some_rank(q, StepKind::exchange, [&](std::size_t i, const MeshCoord& me) {
          return detail::exchange_reduces(q[i].before, q[i].after) &&
                 detail::reducing_exchange_way(detail::step_context(q, i, me, false), packs)
                         .first_round_in_target > 0;
        });
      });
  fmt::print("first round in the target: {} plans on 2x2 and 2x4\n", in_target);
  CHECK(in_target * testing::exhaustive_stride() > 10);
}

TEST_CASE("an exchange from a Partial reduces its own partial a band at a time in its target",
          "[execute][memory]") {
  // (P, S(0)) -> (S(0), S(1)) on 2x2, 8x16 f32, fewest bytes, bounded: one exchange from the
  // Partial. Rank 0 owns the 4x12 columns 0-11 of its 4x16 block (its 4x8 target lies in it),
  // rank 2 the other 4x4. Rank 0 packs its partial of rank 2's part (64 B, in its target),
  // receives rank 2's partial of its own into the slot that holds the reduced part (192 B), then
  // copies its own partial 2 rows (96 B) at a time into its 4x8 target (128 B) and reduces each
  // band; the column piece it sends on is packed (64 B). 256 B, the larger end, where packing
  // its own partial into a slot of its own held 448 B.
  // Rank 1 owns columns 0-3 of rows 4-7 and packs its partial of rank 3's 4x12 (192 B, more
  // than its target holds) beside the slot (64 B); its second round stages the two 4x4 pieces
  // it receives (128 B) where that packed partial was, dead by then: 256 B, not 384.
  const DeviceMesh square({2, 2});
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  const Layout src(square, parse_placements("P,S(0)"), {8, 16});
  const Layout dst(square, parse_placements("S(0),S(1)"), {8, 16});
  const Plan plan = plan_redistribute(
      src, dst, PlanOptions{.objective = Objective::bytes, .memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 1);
  REQUIRE(plan[0].kind == StepKind::exchange);
  const detail::ReducingExchangeWay first =
      detail::reducing_exchange_way(detail::step_context(plan, 0, MeshCoord{0, 0}, false), packs);
  CHECK(first.own_in_bands);
  CHECK(first.band_rows == 2);
  CHECK(first.slots == 1);
  CHECK(first.first_round_in_target == 64);
  CHECK(first.send == 64);
  CHECK(first.recv == 192);
  const detail::ReducingExchangeWay second =
      detail::reducing_exchange_way(detail::step_context(plan, 0, MeshCoord{0, 1}, false), packs);
  CHECK(second.first_round_in_target == 0);
  CHECK(second.first_round_rest == 192);
  CHECK(second.deliver.recv == 128);
  CHECK(second.send == 192);
  CHECK(second.recv == 64);
  CHECK(workspace_bytes<PackingBackend>(plan) == 256);
  CHECK(verified_on(plan).verified);
  check_within_ends(run_strided_and_packed(plan).second, src, dst);
  run_async_packed(plan);

  // Every plan on 2x2 and 2x4 that reduces its own partial in more than one band on some rank
  // (bounded plans only: the others take one band or none), in every dtype and both ops of the
  // matrix: the same bits packed as strided, bytes and scratch as planned, and through
  // execute_async.
  const int banded =
      run_selected_plans({.dtypes = {DType::f32, DType::bf16, DType::i64}}, [&](const Plan& q) {
        return on_some_rank(q, StepKind::exchange, [&](std::size_t i, const MeshCoord& me) {
          if (!detail::exchange_reduces(q[i].before, q[i].after)) return false;
          const detail::ReducingExchangeWay w =
              detail::reducing_exchange_way(detail::step_context(q, i, me, false), packs);
          return w.own_in_bands && w.band_rows < w.reduced_box.shape[0];
        });
      });
  fmt::print("own partial in bands: {} bounded plans on 2x2 and 2x4\n", banded);
  // Few pairs qualify, close together: every 5th pair meets one of them.
  CHECK(banded >= (testing::exhaustive_stride() == 1 ? 60 : 1));
}

TEST_CASE("a reduce-scatter by messages reduces its own partial a band at a time",
          "[execute][memory]") {
  // (S(1), P) -> (S(1), S(1)) on 2x2, 7x10 f32, bounded: an uneven reduce-scatter over mesh
  // dim 1 of each rank's 7x5 block into column pieces of 3 and 2, one point-to-point round. On
  // a packing backend rank 0 packed its partial of rank 1's 7x2 piece (56 B) and received rank
  // 1's partial of its own 7x3 piece into staging (84 B), its own partial copied into the
  // target: 140 B. Now rank 1's partial comes into the target and, after the round, rank 0 copies
  // its own partial 4 rows (48 B) at a time into the packed piece's staging, dead by then, and
  // reduces each band from there: 56 B. Rank 1 packs 7x3 columns (84 B) and copies its whole
  // 7x2 piece there in one band: 84 B.
  const DeviceMesh square({2, 2});
  constexpr auto packs = detail::abilities_of<detail::Link<PackingBackend>>;
  const Layout src(square, parse_placements("S(1),P"), {7, 10});
  const Layout dst(square, parse_placements("S(1),S(1)"), {7, 10});
  const Plan plan = plan_redistribute(src, dst, PlanOptions{.memory = Memory::bounded});
  INFO(explain(plan));
  REQUIRE(plan.size() == 1);
  REQUIRE(plan[0].kind == StepKind::reduce_scatter);
  auto way_at = [&](const Plan& q, std::size_t i, const MeshCoord& me) {
    const detail::StepContext c = detail::step_context(q, i, me, false);
    const int k = c.step.mesh_dim;
    return detail::exchange_reduce_way(
        c, detail::slabs_along(c.have.shape, c.step.after[k].dim()),
        [&c](int j) { return detail::member_box(c, c.after, j); }, packs);
  };
  const detail::ExchangeReduceWay first = way_at(plan, 0, MeshCoord{0, 0});
  CHECK(first.own_in_bands);
  CHECK(first.band_rows == 4);
  CHECK(first.send == 56);
  CHECK(first.recv == 0);
  const detail::ExchangeReduceWay second = way_at(plan, 0, MeshCoord{0, 1});
  CHECK(second.own_in_bands);
  CHECK(second.band_rows == 7);
  CHECK(second.allocated() == 84);
  CHECK(workspace_bytes<PackingBackend>(plan) == 84);
  CHECK(verified_on(plan).verified);
  check_within_ends(run_strided_and_packed(plan).second, src, dst);
  run_async_packed(plan);

  // Every plan on 2x2 and 2x4 with such a reduce-scatter on some rank, bounded or not, in f32,
  // bf16 and i64: the same bits packed as strided, bytes and scratch as planned, and (f32)
  // through execute_async.
  const int banded = run_selected_plans(
      {.shapes = {{7, 10}},
       .memories = {Memory::any, Memory::bounded},
       .dtypes = {DType::f32, DType::bf16, DType::i64}},
      [&](const Plan& q) {
        return on_some_rank(q, StepKind::reduce_scatter, [&](std::size_t i, const MeshCoord& me) {
          return detail::scatters_by_messages(detail::step_context(q, i, me, false), packs) &&
                 way_at(q, i, me).own_in_bands;
        });
      });
  fmt::print("reduce-scatter own partial in bands: {} plans on 2x2 and 2x4\n", banded);
  CHECK(banded * testing::exhaustive_stride() > 10);
}

TEST_CASE("by default a large redistribution holds the memory bound where it costs little",
          "[execute][memory]") {
  // (S(0), R) -> (R, S(0)) on 2x4, 1024x512 f32 (1 MiB source blocks): the fastest plan
  // gathers a 2 MiB block between its steps; Memory::automatic, the default, takes the one
  // exchange (5.75 µs against 5.5 µs by the model), which holds nothing between steps. On every
  // rank the run holds no more scratch than the larger of its blocks, on a strided backend and
  // on one that packs, and the values are the global view's.
  const DeviceMesh mesh({2, 4});
  const Layout src(mesh, parse_placements("S(0),R"), {1024, 512});
  const Layout dst(mesh, parse_placements("R,S(0)"), {1024, 512});
  const Plan plan = plan_redistribute(src, dst);
  const Plan fast = plan_redistribute(src, dst, PlanOptions{.memory = Memory::any});
  INFO(explain(plan));
  REQUIRE(plan.memory_bounded());
  CHECK(verified_on(plan).verified);
  const auto [strided, packed] = run_strided_and_packed(plan);
  bool fast_over = false;
  for (int i = 0; i < mesh.size(); ++i) {
    const auto u = static_cast<std::size_t>(i);
    const int rank = mesh.rank_at(i);
    const std::int64_t ends = std::max(src.local_bytes(rank), dst.local_bytes(rank));
    CHECK(strided.scratch_peak[u] <= ends);
    CHECK(packed.scratch_peak[u] <= ends);
    fast_over = fast_over || workspace_bytes<SimulatedBackend>(fast, rank) > ends;
  }
  CHECK(fast_over);
}

TEST_CASE("local steps in a row run as one pass over the last block", "[execute][memory]") {
  // Fill then chunk, scale then chunk, chunk then fill, chunks: one pass from the block before
  // them to the block after (no block between), under both ways of making a Partial from
  // Replicate, in every kind of dtype; values against the global view.
  struct Case {
    std::string_view mesh, from, to;
  };
  const Case cases[] = {{"2x2", "R,S(0)", "S(0),P(sum)"},    {"2x2", "S(0),R", "P(sum),S(1)"},
                        {"2x2", "R,R", "P(sum),S(0)"},       {"2x2", "R,R", "S(1),P(sum)"},
                        {"2x4", "R,R", "S(0),S(1)"},         {"2x4", "R,S(1)", "P(max),S(0)"},
                        {"2x2x2", "R,R,R", "P(sum),S(0),P"}, {"2x2x2", "R,R,R", "S(1),P(avg),S(0)"},
                        {"2x2", "R,R", "P(max),P(max)"},     {"2x2", "R,S(0)", "P(avg),P(avg)"}};
  int fused = 0;
  for (const Case& c : cases)
    for (PartialFromReplicate how : {PartialFromReplicate::divide, PartialFromReplicate::keep_one})
      for (DType dtype : {DType::f32, DType::i64, DType::bf16})
        for (const Shape& shape : {Shape{8, 12}, Shape{5, 7}}) {
          if (!is_floating(dtype) && (c.to.find("avg") != std::string_view::npos)) continue;
          const DeviceMesh mesh = parse_mesh(c.mesh);
          PlanOptions options;
          options.partial_from_replicate = how;
          const Plan plan =
              plan_redistribute(Layout(mesh, parse_placements(c.from), shape, dtype),
                                Layout(mesh, parse_placements(c.to), shape, dtype), options);
          INFO(fmt::format("{}: {} -> {} {} {}", c.mesh, c.from, c.to, shape, dtype));
          INFO(explain(plan));
          detail::Stage stages[max_plan_steps];
          const std::size_t n = detail::stages_of(plan, stages);
          if (n < plan.size()) ++fused;
          const Verification v = verified_on(plan);
          CHECK(v.verified);
          CHECK(v.difference == "");
          // Nothing moves, so nothing is held: the one pass writes the target.
          if (n == 1 && plan.size() > 1) CHECK(workspace_bytes(plan) == 0);
        }
  CHECK(fused > 0);
}

TEST_CASE("host staging: large blocks are reused, small ones and misfits are not",
          "[execute][staging]") {
  detail::HostBlockCache cache;
  std::size_t capacity = 0;
  auto block = cache.take(std::size_t{1} << 20, capacity);
  REQUIRE(capacity == std::size_t{1} << 20);
  std::byte* const first = block.get();
  cache.give(std::move(block), capacity);
  CHECK(cache.bytes() == std::size_t{1} << 20);
  // A request it fits without wasting more than the request: the same block.
  block = cache.take(std::size_t{600} << 10, capacity);
  CHECK(block.get() == first);
  CHECK(capacity == std::size_t{1} << 20);
  CHECK(cache.bytes() == 0);
  cache.give(std::move(block), capacity);
  // Too small a request for it (it would hold 1 MiB for 100 KiB): a new block.
  std::size_t other = 0;
  auto small = cache.take(std::size_t{100} << 10, other);
  CHECK(small.get() != first);
  CHECK(other == std::size_t{100} << 10);
  // Blocks under min_cached_bytes are not kept.
  cache.give(std::make_unique<std::byte[]>(1024), 1024);
  CHECK(cache.bytes() == std::size_t{1} << 20);
  cache.clear();
  CHECK(cache.bytes() == 0);

  // HostOps buffers go through this thread's cache: the second run's staging is the first's.
  detail::host_block_cache().clear();
  std::byte* seen = nullptr;
  {
    const HostOps::Buffer b = HostOps{}.allocate(std::size_t{2} << 20);
    seen = b.data();
  }
  const HostOps::Buffer again = HostOps{}.allocate(std::size_t{2} << 20, true);
  CHECK(again.data() == seen);
  CHECK(std::all_of(again.data(), again.data() + again.size(),
                    [](std::byte x) { return x == std::byte{0}; }));
}

TEST_CASE("a simulated world keeps its ranks' threads from run to run, past a failed run",
          "[execute][simulated]") {
  const DeviceMesh mesh({2, 2});
  const Plan plan = plan_redistribute(Layout(mesh, {Shard(0), Shard(1)}, {4, 6}),
                                      Layout(mesh, {Replicate(), Replicate()}, {4, 6}));
  std::vector<std::vector<float>> in;
  for (int r = 0; r < mesh.size(); ++r) in.push_back(global_view_block<float>(plan.src(), r));
  const std::vector<float> want = global_view_block<float>(plan.dst(), 0);
  SimulatedWorld world(mesh);
  std::vector<std::thread::id> first(4), again(4);
  auto gather = [&](std::vector<std::thread::id>& ids) {
    world.reset_counters();
    std::vector<std::vector<float>> out(4, std::vector<float>(24, -1.0F));
    world.run([&](SimulatedBackend& b) {
      const auto r = static_cast<std::size_t>(b.rank());
      ids[r] = std::this_thread::get_id();
      execute(plan, b, std::span<const float>(in[r]), std::span<float>(out[r]));
    });
    for (int r = 0; r < mesh.size(); ++r) {
      CHECK(out[static_cast<std::size_t>(r)] == want);
      CHECK(world.bytes(r) == rank_bytes(plan, r));
    }
  };
  gather(first);
  // Rank 3 fails between two collectives while rank 1 waits for it in the second: the run ends
  // with rank 3's error, and rank 1 is let go rather than left waiting.
  CHECK_THROWS_WITH(world.run([&](SimulatedBackend& b) {
    std::vector<float> piece(2, 1.0F), all(4);
    b.all_gather(0, piece.data(), all.data(), sizeof(float) * 2);
    if (b.rank() == 3) throw error("rank 3 fails");
    b.all_gather(1, piece.data(), all.data(), sizeof(float) * 2);
  }),
                    "rank 3 fails");
  gather(again);
  CHECK(again == first);
  // A world destroyed before any run has no threads to end.
  { const SimulatedWorld idle(mesh); }
}
