#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/simulated.hpp"
#include "batch_plan.hpp"
#include "detail/elementwise.hpp"
#include "execute.hpp"
#include "execute_batch.hpp"
#include "plan.hpp"

// The global-view check of a plan, on the simulated backend: a global tensor holding its own
// linear index is cut into every rank's source block (Partial sources as distinct parts that
// reduce to it), the plan runs, and every rank's result must equal its block of the target
// (Partial targets: once their group's parts are reduced). What dtensor-plan --execute runs.
namespace dtensor {

// The outcome of verify_on_simulator.
struct Verification {
  bool verified = false;
  // What differs first, when not verified.
  std::string difference;
  // Per rank (in row-major mesh order): the bytes measured by the simulated backend.
  std::vector<RankBytes> measured;
  // Per rank: the source block given and the result, raw bytes of the plan's dtype.
  std::vector<std::vector<std::byte>> sources, results;
};

namespace detail {

// Part `c` of `g` parts of x that reduce to x under op; distinct and mostly non-zero. For an
// unsigned element type the parts stay non-negative: sum and avg then keep x on the first
// rank (0 or x elsewhere), max puts 0 elsewhere.
inline double partial_part(double x, ReduceOp op, int c, int g, bool non_negative = false) {
  if (non_negative) {
    switch (op) {
      case ReduceOp::sum: return c == 0 ? x : 0.0;
      case ReduceOp::avg: return x;
      case ReduceOp::max: return c == 0 ? x : 0.0;
      default: break;
    }
  }
  switch (op) {
    case ReduceOp::sum: return c < g - 1 ? double(c + 1) : x - double((g - 1) * g) / 2;
    case ReduceOp::avg: return c < g - 1 ? x + double(c + 1) : x - double((g - 1) * g) / 2;
    case ReduceOp::max: return c == 0 ? x : x - double(c + 1);
    case ReduceOp::min: return c == 0 ? x : x + double(c + 1);
    case ReduceOp::product: return c == 0 ? x : 1.0;
  }
  return x;
}

// Calls f(linear index in the global tensor, position in the block) for every element of box.
template <class F>
void for_each_element(const Shape& global, const Box& box, F&& f) {
  const int nd = static_cast<int>(box.shape.size());
  if (box.empty()) return;
  std::int64_t index[max_tensor_dims] = {};
  for (std::int64_t position = 0;; ++position) {
    std::int64_t linear = 0;
    for (int d = 0; d < nd; ++d) linear = linear * global[d] + box.offset[d] + index[d];
    f(linear, position);
    int d = nd - 1;
    for (; d >= 0; --d) {
      if (++index[d] < box.shape[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace detail

namespace detail {

// The value at linear index `linear` of the global view: the index itself, wrapped where T
// cannot hold it exactly together with the partial parts made from it (u8 and the other
// integers: no overflow, which would be undefined; f16 and bf16: integers their few mantissa
// bits hold exactly, so that parts reduce back to the value without rounding).
template <class T>
double global_view_value(std::int64_t linear) {
  std::int64_t period = 0;
  if constexpr (std::is_same_v<T, std::uint8_t>)
    period = 64;
  else if constexpr (std::is_same_v<T, bf16_t>)
    period = 128;
  else if constexpr (std::is_same_v<T, f16_t>)
    period = 1024;
  else if constexpr (std::is_same_v<T, float>)
    period = std::int64_t{1} << 23;
  else if constexpr (std::is_integral_v<T>)
    period = static_cast<std::int64_t>(std::numeric_limits<T>::max() / 2);
  return double(period > 0 ? linear % period : linear);
}

}  // namespace detail

// Global rank `rank`'s block of `layout` when the global tensor holds its own linear index
// (row-major; wrapped where the dtype cannot hold it exactly: detail::global_view_value): the
// source a global-view check gives each rank. Partial dims split each value into distinct
// parts that reduce to it (innermost first, since reductions run outermost first).
template <class T>
std::vector<T> global_view_block(const Layout& layout, int rank) {
  const DeviceMesh& mesh = layout.mesh();
  const MeshCoord c = mesh.coordinate(rank);
  const Box box = layout.local_box(c);
  std::vector<T> v(static_cast<std::size_t>(box.numel()));
  detail::for_each_element(layout.global_shape(), box, [&](std::int64_t linear, std::int64_t at) {
    double x = detail::global_view_value<T>(linear);
    for (int k = mesh.ndim(); k-- > 0;)
      if (layout.placement(k).is_partial())
        x = detail::partial_part(x, layout.placement(k).reduce_op(), c[k], mesh.size(k),
                                 std::is_unsigned_v<T>);
    v[static_cast<std::size_t>(at)] = detail::narrow<T>(static_cast<detail::compute_t<T>>(x));
  });
  return v;
}

namespace detail {

// Runs `plan` on some backend with in[i] as the source of the rank at mesh index i, filling
// out[i] with its result, measured[i] with the bytes it moved, and in[i] with the source buffer
// as it is after the run.
template <class T>
using RunOnRanks = void (*)(const Plan&, std::vector<std::vector<T>>& in,
                            std::vector<std::vector<T>>& out, std::vector<RankBytes>& measured);

// Runs the plan on host memory, on `world` (of the plan's mesh), through backend B: the
// simulated backend itself, or a backend constructed around it (a wrapper that changes what it
// can do). `held` (where given, one entry per rank, mesh index order): the scratch each rank
// held (ExecuteStats::scratch_peak_bytes).
template <class T, class B = SimulatedBackend>
void run_on_simulator(SimulatedWorld& world, const Plan& plan, std::vector<std::vector<T>>& in,
                      std::vector<std::vector<T>>& out, std::vector<RankBytes>& measured,
                      std::vector<std::int64_t>* held = nullptr) {
  const DeviceMesh& mesh = plan.src().mesh();
  world.reset_counters();
  world.run([&](SimulatedBackend& b) {
    const auto i = static_cast<std::size_t>(mesh.index_of(b.rank()));
    ExecuteStats stats;
    if constexpr (std::is_same_v<B, SimulatedBackend>) {
      execute(plan, b, std::span<const T>(in[i]), std::span<T>(out[i]), &stats);
    } else {
      B on(b);
      execute(plan, on, std::span<const T>(in[i]), std::span<T>(out[i]), &stats);
    }
    if (held != nullptr) (*held)[i] = stats.scratch_peak_bytes;
  });
  for (int i = 0; i < mesh.size(); ++i) measured.push_back(world.bytes(mesh.rank_at(i)));
}

template <class T>
void check_typed(const Plan& plan, const std::vector<std::vector<T>>& given,
                 const std::vector<std::vector<T>>& in, const std::vector<std::vector<T>>& out,
                 const std::vector<RankBytes>* measured, Verification& report);

// The global-view check of `plan` with `run` executing it (a RunOnRanks<T>, or any callable
// of its arguments).
template <class T, class Run>
Verification verify_typed(const Plan& plan, const Run& run) {
  const Layout& src = plan.src();
  const Layout& dst = plan.dst();
  const DeviceMesh& mesh = src.mesh();
  const int n = mesh.size();
  std::vector<std::vector<T>> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int rank = mesh.rank_at(i);
    in[static_cast<std::size_t>(i)] = global_view_block<T>(src, rank);
    out[static_cast<std::size_t>(i)].assign(static_cast<std::size_t>(dst.local_numel(rank)), T{});
  }
  const std::vector<std::vector<T>> given = in;
  Verification report;
  std::vector<RankBytes> measured;
  try {
    run(plan, in, out, measured);
  } catch (const std::exception& e) {
    report.difference = std::string("the run failed: ") + e.what();
    return report;
  }
  check_typed<T>(plan, given, in, out, &measured, report);
  return report;
}

// Checks the results `out` of a run of `plan` from the sources `given` (`in`: the source
// buffers after the run) against the global view, and `measured` (when given) against the
// planned bytes; the first difference goes to `report`.
template <class T>
void check_typed(const Plan& plan, const std::vector<std::vector<T>>& given,
                 const std::vector<std::vector<T>>& in, const std::vector<std::vector<T>>& out,
                 const std::vector<RankBytes>* measured, Verification& report) {
  const Layout& src = plan.src();
  const Layout& dst = plan.dst();
  const DeviceMesh& mesh = src.mesh();
  const int n = mesh.size();
  const Shape& global = src.global_shape();
  auto differ = [&](std::string what) {
    if (report.difference.empty()) report.difference = std::move(what);
  };
  const double tolerance = src.dtype() == DType::bf16 || src.dtype() == DType::f16 ? 1e-2
                           : is_floating(src.dtype())                              ? 1e-6
                                                                                   : 0.0;
  for (int i = 0; i < n; ++i) {
    const int rank = mesh.rank_at(i);
    if (measured != nullptr) {
      report.measured.push_back((*measured)[static_cast<std::size_t>(i)]);
      if (!(report.measured.back() == rank_bytes(plan, rank)))
        differ("rank " + std::to_string(rank) + " moved other bytes than planned");
    }
    if (in[static_cast<std::size_t>(i)] != given[static_cast<std::size_t>(i)])
      differ("rank " + std::to_string(rank) + "'s source buffer was written");
  }
  // Reduce each target group (ranks that differ only on the target's Partial dims),
  // outermost Partial dim first, and compare with the global view.
  for (int i = 0; i < n; ++i) {
    const MeshCoord c = mesh.coordinate_at(i);
    bool leader = true;
    for (int k = 0; k < mesh.ndim(); ++k)
      leader = leader && (!dst.placement(k).is_partial() || c[k] == 0);
    if (!leader) continue;
    const Box box = dst.local_box(c);
    // value(coords on the Partial dims) for this block, folded dim by dim.
    std::vector<MeshCoord> members{c};
    for (int k = 0; k < mesh.ndim(); ++k) {
      if (!dst.placement(k).is_partial()) continue;
      std::vector<MeshCoord> next;
      for (const MeshCoord& m : members)
        for (int j = 0; j < mesh.size(k); ++j) {
          MeshCoord x = m;
          x[k] = j;
          next.push_back(x);
        }
      members = next;
    }
    const auto count = static_cast<std::size_t>(box.numel());
    // Each member's values and, reduced alongside them, their magnitudes: a sum's rounding
    // error grows with the sum of its parts' magnitudes, not with its value (parts of a
    // Replicate divided by 3 in bf16, say, each rounded, reduce to a value much smaller).
    std::vector<std::vector<double>> values, magnitudes;
    for (const MeshCoord& m : members) {
      const auto& o = out[static_cast<std::size_t>(mesh.index(m))];
      std::vector<double> v(count), a(count);
      for (std::size_t e = 0; e < count; ++e) {
        v[e] = double(widen(o[e]));
        a[e] = std::abs(v[e]);
      }
      values.push_back(std::move(v));
      magnitudes.push_back(std::move(a));
    }
    std::size_t stride = values.size();
    for (int k = 0; k < mesh.ndim(); ++k) {
      if (!dst.placement(k).is_partial()) continue;
      const auto g = static_cast<std::size_t>(mesh.size(k));
      const ReduceOp op = dst.placement(k).reduce_op();
      // The magnitude a reduction's rounding scales with: summed for sum and avg, multiplied
      // for product, the largest for max and min (the result is one of the parts).
      const ReduceOp magnitude_op = op == ReduceOp::avg   ? ReduceOp::sum
                                    : op == ReduceOp::min ? ReduceOp::max
                                                          : op;
      stride /= g;
      std::vector<std::vector<double>> reduced, reduced_magnitudes;
      for (std::size_t start = 0; start < values.size(); start += g * stride)
        for (std::size_t s = 0; s < stride; ++s) {
          std::vector<double> acc = values[start + s], mag = magnitudes[start + s];
          for (std::size_t j = 1; j < g; ++j)
            for (std::size_t e = 0; e < count; ++e) {
              acc[e] = combine(acc[e], values[start + j * stride + s][e], op);
              mag[e] = combine(mag[e], magnitudes[start + j * stride + s][e], magnitude_op);
            }
          if (op == ReduceOp::avg)
            for (std::size_t e = 0; e < count; ++e) {
              acc[e] /= double(g);
              mag[e] /= double(g);
            }
          reduced.push_back(std::move(acc));
          reduced_magnitudes.push_back(std::move(mag));
        }
      values = std::move(reduced);
      magnitudes = std::move(reduced_magnitudes);
    }
    for_each_element(global, box, [&](std::int64_t linear, std::int64_t at) {
      const double got = values[0][static_cast<std::size_t>(at)],
                   want = global_view_value<T>(linear),
                   scale =
                       std::max({std::abs(want), magnitudes[0][static_cast<std::size_t>(at)], 1.0});
      if (std::abs(got - want) > tolerance * scale)
        differ("rank " + std::to_string(mesh.rank(c)) + " holds " + std::to_string(got) +
               " where the target has " + std::to_string(want) + " (global element " +
               std::to_string(linear) + ")");
    });
  }
  // Replicas are bit-identical.
  if (!has_partial(dst.placements()))
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j)
        if (dst.local_box(mesh.rank_at(i)) == dst.local_box(mesh.rank_at(j)) &&
            !out[static_cast<std::size_t>(i)].empty() &&
            std::memcmp(out[static_cast<std::size_t>(i)].data(),
                        out[static_cast<std::size_t>(j)].data(),
                        out[static_cast<std::size_t>(i)].size() * sizeof(T)) != 0)
          differ("replicas " + std::to_string(mesh.rank_at(i)) + " and " +
                 std::to_string(mesh.rank_at(j)) + " differ");
  report.verified = report.difference.empty();
  for (int i = 0; i < n; ++i) {
    const auto& s = in[static_cast<std::size_t>(i)];
    const auto& o = out[static_cast<std::size_t>(i)];
    report.sources.emplace_back(reinterpret_cast<const std::byte*>(s.data()),
                                reinterpret_cast<const std::byte*>(s.data() + s.size()));
    report.results.emplace_back(reinterpret_cast<const std::byte*>(o.data()),
                                reinterpret_cast<const std::byte*>(o.data() + o.size()));
  }
}

}  // namespace detail

// Runs `plan` on the ranks of `world` with the global view as data and checks every rank.
// The world must be on the plan's mesh; one kept for many plans starts its threads once.
inline Verification verify_on_simulator(const Plan& plan, SimulatedWorld& world) {
  if (!(world.mesh() == plan.src().mesh()))
    detail::fail<detail::why::world_mesh_mismatch>(world.mesh().shape(), plan.src().mesh().shape());
  return detail::visit_dtype(plan.src().dtype(), [&]<class T>() {
    return detail::verify_typed<T>(
        plan, [&](const Plan& p, std::vector<std::vector<T>>& in, std::vector<std::vector<T>>& out,
                  std::vector<RankBytes>& measured) {
          detail::run_on_simulator<T>(world, p, in, out, measured);
        });
  });
}

// Runs `plan` on a simulated mesh with the global view as data and checks every rank.
inline Verification verify_on_simulator(const Plan& plan) {
  SimulatedWorld world(plan.src().mesh());
  return verify_on_simulator(plan, world);
}

// The outcome of verify_batch_on_simulator.
struct BatchVerification {
  bool verified = false;
  // What differs first, when not verified.
  std::string difference;
  // Per tensor: its global-view check (its results and sources; no bytes, which the batch
  // moves together).
  std::vector<Verification> tensors;
  // Per rank (row-major mesh order): the bytes the whole batch moved, measured.
  std::vector<RankBytes> measured;
  // Collective calls and point-to-point rounds the simulated backend counted.
  std::int64_t collectives = 0;
};

namespace detail {

// Every tensor's blocks on every rank (row-major mesh order), raw bytes.
using RankBlocks = std::vector<std::vector<std::vector<std::byte>>>;

// Runs `batch` on some world of its mesh: in[t][i] and out[t][i] are tensor t's source and
// result on the i-th rank; fills each rank's measured bytes and returns the backend calls counted.
using RunBatchOnRanks = std::int64_t (*)(const void* batch, RankBlocks& in, RankBlocks& out,
                                         std::vector<RankBytes>& measured);

// Runs `batch` on `world` (of the batch's mesh), as RunBatchOnRanks says.
template <std::size_t N>
std::int64_t run_batch_on_simulator(SimulatedWorld& world, const BatchPlan<N>& plan, RankBlocks& in,
                                    RankBlocks& out, std::vector<RankBytes>& measured) {
  const DeviceMesh& mesh = plan[0].src().mesh();
  world.reset_counters();
  world.run([&](SimulatedBackend& b) {
    const auto i = static_cast<std::size_t>(mesh.index_of(b.rank()));
    std::vector<TensorBuffers> buffers;
    for (std::size_t t = 0; t < plan.size(); ++t)
      buffers.push_back({in[t][i].data(), in[t][i].size(), out[t][i].data(), out[t][i].size()});
    execute(plan, b, std::span<const TensorBuffers>(buffers));
  });
  for (int i = 0; i < mesh.size(); ++i) measured.push_back(world.bytes(mesh.rank_at(i)));
  return world.collectives();
}

// The global-view check of `batch`, run by `run` (a RunBatchOnRanks, or any callable of its
// arguments).
template <std::size_t N, class Run>
BatchVerification verify_batch(const BatchPlan<N>& batch, const Run& run) {
  BatchVerification report;
  if (batch.empty()) {
    report.verified = true;
    return report;
  }
  const DeviceMesh& mesh = batch[0].src().mesh();
  const auto ranks = static_cast<std::size_t>(mesh.size());
  using Bytes = std::vector<std::byte>;
  RankBlocks in(batch.size()), out(batch.size());
  for (std::size_t t = 0; t < batch.size(); ++t) {
    const Plan& p = batch[t];
    for (std::size_t i = 0; i < ranks; ++i) {
      const int rank = mesh.rank_at(static_cast<int>(i));
      visit_dtype(p.src().dtype(), [&]<class T>() {
        const std::vector<T> block = global_view_block<T>(p.src(), rank);
        in[t].emplace_back(reinterpret_cast<const std::byte*>(block.data()),
                           reinterpret_cast<const std::byte*>(block.data() + block.size()));
      });
      out[t].emplace_back(static_cast<std::size_t>(p.dst().local_bytes(rank)));
    }
  }
  const RankBlocks given = in;
  try {
    report.collectives = run(&batch, in, out, report.measured);
  } catch (const std::exception& e) {
    report.measured.clear();
    report.difference = std::string("the run failed: ") + e.what();
    return report;
  }
  for (std::size_t i = 0; i < ranks; ++i) {
    const int rank = mesh.rank_at(static_cast<int>(i));
    if (report.difference.empty() && !(report.measured[i] == batch_rank_bytes(batch, rank)))
      report.difference = "rank " + std::to_string(rank) + " moved other bytes than planned";
  }
  for (std::size_t t = 0; t < batch.size(); ++t) {
    Verification v;
    visit_dtype(batch[t].src().dtype(), [&]<class T>() {
      auto typed = [](const std::vector<Bytes>& blocks) {
        std::vector<std::vector<T>> x;
        for (const Bytes& b : blocks) {
          std::vector<T> v(b.size() / sizeof(T));
          if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
          x.push_back(std::move(v));
        }
        return x;
      };
      check_typed<T>(batch[t], typed(given[t]), typed(in[t]), typed(out[t]), nullptr, v);
    });
    if (report.difference.empty() && !v.verified)
      report.difference = "tensor " + std::to_string(t) + ": " + v.difference;
    report.tensors.push_back(std::move(v));
  }
  report.verified = report.difference.empty();
  return report;
}

}  // namespace detail

// Runs the batched plan on the ranks of `world`, every tensor's global view as its data, and
// checks every tensor on every rank, the bytes each rank moved against batch_rank_bytes, and
// counts the backend's collectives. The world must be on the batch's mesh; one kept for many
// batches starts its threads once.
template <std::size_t N>
BatchVerification verify_batch_on_simulator(const BatchPlan<N>& batch, SimulatedWorld& world) {
  if (!batch.empty() && !(world.mesh() == batch[0].src().mesh()))
    detail::fail<detail::why::world_mesh_mismatch>(world.mesh().shape(),
                                                   batch[0].src().mesh().shape());
  return detail::verify_batch(
      batch, [&](const void*, detail::RankBlocks& in, detail::RankBlocks& out,
                 std::vector<RankBytes>& measured) {
        return detail::run_batch_on_simulator(world, batch, in, out, measured);
      });
}

// verify_batch_on_simulator on a fresh simulated world of the batch's mesh.
template <std::size_t N>
BatchVerification verify_batch_on_simulator(const BatchPlan<N>& batch) {
  if (batch.empty()) {
    BatchVerification nothing;
    nothing.verified = true;
    return nothing;
  }
  SimulatedWorld world(batch[0].src().mesh());
  return verify_batch_on_simulator(batch, world);
}

}  // namespace dtensor
