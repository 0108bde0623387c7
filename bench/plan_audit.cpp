// Audits the planner's candidates: for every pair of placements over {R, S(0), S(1), P(sum),
// P(max)} on meshes 4, 2x2, 2x4 and 2x2x2, shapes 8x16 and 7x10 (f32), a Dijkstra search over
// placement states, one per-mesh-dim step per edge costed as the planner costs it, looks for a
// chain of steps cheaper than plan_redistribute's plan (both without exchanges, which no chain
// of per-mesh-dim steps expresses). Prints each such case with the chain, then how many.
//
//   plan_audit [time|bytes] [--large]     (the objective; time by default)
//
// --large: meshes 4x2, 4x4, 2x8, 3x2, 8 and 4x2x2, shapes 16x32, 15x22 and 1024x4096 (16 MiB,
// where bandwidth decides which links the bytes cross), placements over {R, S(0), S(1), P(sum)}.
//
// A Partial is made (from R or S) only once no other mesh dim holds a Partial the target does
// not keep, as the planner's order search requires (reductions_first).
#include <dtensor/dtensor.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <queue>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using namespace dtensor;

struct Audit {
  int cases = 0;
  int gaps = 0;
};

// Placement list number `code` over `alphabet` on `dims` mesh dims (mesh dim 0 the fastest
// digit).
Placements placements_at(const std::vector<Placement>& alphabet, int dims, int code) {
  Placements ps;
  const auto letters = static_cast<int>(alphabet.size());
  for (int k = 0; k < dims; ++k, code /= letters)
    ps.push_back(alphabet[static_cast<std::size_t>(code % letters)]);
  return ps;
}
// How many placement lists there are over `alphabet` on `dims` mesh dims.
int placement_lists(const std::vector<Placement>& alphabet, int dims) {
  int lists = 1;
  for (int k = 0; k < dims; ++k) lists *= static_cast<int>(alphabet.size());
  return lists;
}

// The cheapest chain from `src` to `dst` by per-step cost under `options`, and its states.
std::pair<double, std::vector<Placements>> cheapest_chain(const Layout& src, const Layout& dst,
                                                          const PlanOptions& options) {
  const DeviceMesh& mesh = src.mesh();
  const Placements& a = src.placements();
  const Placements& b = dst.placements();
  std::vector<Placement> alphabet{Placement::replicate()};
  for (int d = 0; d < src.tensor_ndim(); ++d) alphabet.push_back(Placement::shard(d));
  for (const Placements* ps : {&a, &b})
    for (const Placement& p : *ps)
      if (p.is_partial() && std::find(alphabet.begin(), alphabet.end(), p) == alphabet.end())
        alphabet.push_back(p);
  const int letters = static_cast<int>(alphabet.size()), dims = mesh.ndim();
  auto encode = [&](const Placements& ps) {
    int code = 0;
    for (int k = dims; k-- > 0;)
      code = code * letters + static_cast<int>(std::find(alphabet.begin(), alphabet.end(),
                                                         ps[static_cast<std::size_t>(k)]) -
                                               alphabet.begin());
    return code;
  };
  auto decode = [&](int code) { return placements_at(alphabet, dims, code); };
  const int states = placement_lists(alphabet, dims);
  std::vector<double> dist(static_cast<std::size_t>(states), 1e300);
  std::vector<int> prev(static_cast<std::size_t>(states), -1);
  using Entry = std::pair<double, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
  dist[static_cast<std::size_t>(encode(a))] = 0;
  queue.push({0, encode(a)});
  while (!queue.empty()) {
    const auto [d, s] = queue.top();
    queue.pop();
    if (d > dist[static_cast<std::size_t>(s)]) continue;
    const Placements ps = decode(s);
    for (int k = 0; k < dims; ++k) {
      const Placement from = ps[static_cast<std::size_t>(k)];
      for (const Placement& to : alphabet) {
        if (to == from || (from.is_partial() && to.is_partial())) continue;
        if (!detail::transition_valid_to(k, ps, to)) continue;
        bool pending = false;  // a reduction still to come: no Partial is made before it
        for (int j = 0; j < dims && to.is_partial() && !from.is_partial(); ++j) {
          const auto u = static_cast<std::size_t>(j);
          pending = pending || (j != k && ps[u].is_partial() && !(ps[u] == b[u]));
        }
        if (pending) continue;
        Placements next = ps;
        next[static_cast<std::size_t>(k)] = to;
        detail::Transitions step;
        step.push_back({k, from, to});
        const Plan p = detail::plan_builder::build(src.with_placements(ps),
                                                   src.with_placements(next), step, options);
        if (detail::plan_builder::pruned(p)) continue;
        const double cost = options.objective == Objective::bytes
                                ? double(p.bytes_recv_max()) + p.est_us() * 1e-9
                                : p.est_us();
        const int n = encode(next);
        if (d + cost < dist[static_cast<std::size_t>(n)] - 1e-12) {
          dist[static_cast<std::size_t>(n)] = d + cost;
          prev[static_cast<std::size_t>(n)] = s;
          queue.push({d + cost, n});
        }
      }
    }
  }
  std::vector<Placements> chain;
  for (int s = encode(b); s != -1; s = prev[static_cast<std::size_t>(s)])
    chain.insert(chain.begin(), decode(s));
  return {dist[static_cast<std::size_t>(encode(b))], chain};
}

void audit(const DeviceMesh& mesh, const Shape& shape, const Placements& a, const Placements& b,
           Objective objective, Audit& out) {
  const Layout src(mesh, a, shape), dst(mesh, b, shape);
  PlanOptions options;
  options.objective = objective;
  options.allow_exchange = false;
  options = options.with_cost_model(CostModel::defaults(mesh));
  const Plan plan = plan_redistribute(src, dst, options);
  const double ours = objective == Objective::bytes
                          ? double(plan.bytes_recv_max()) + plan.est_us() * 1e-9
                          : plan.est_us();
  const auto [best, chain] = cheapest_chain(src, dst, options);
  ++out.cases;
  if (best >= ours * (1 - 1e-6) - 1e-9) return;
  ++out.gaps;
  std::string states;
  for (const Placements& ps : chain) states += fmt::format(" {}", ps);
  fmt::print("{} {} f32 {} -> {}: plan {:.6g} ({} steps), chain {:.6g}:{}\n", mesh.shape(), shape,
             a, b, ours, plan.size(), best, states);
}

}  // namespace

int main(int argc, char** argv) {
  std::string_view mode = "time";
  bool large = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--large") {
      large = true;
    } else if (arg == "time" || arg == "bytes") {
      mode = arg;
    } else {
      std::fprintf(stderr,
                   "plan_audit: unknown argument '%s'\nusage: plan_audit [time|bytes] "
                   "[--large]\n",
                   argv[i]);
      return 2;
    }
  }
  const Objective objective = mode == "bytes" ? Objective::bytes : Objective::time;
  try {
    std::vector<Placement> letters{Placement::replicate(), Placement::shard(0), Placement::shard(1),
                                   Placement::partial(ReduceOp::sum)};
    if (!large) letters.push_back(Placement::partial(ReduceOp::max));
    const std::vector<DeviceMesh> meshes =
        large ? std::vector{DeviceMesh({4, 2}), DeviceMesh({4, 4}), DeviceMesh({2, 8}),
                            DeviceMesh({3, 2}), DeviceMesh({8}),    DeviceMesh({4, 2, 2})}
              : std::vector{DeviceMesh({4}), DeviceMesh({2, 2}), DeviceMesh({2, 4}),
                            DeviceMesh({2, 2, 2})};
    const std::vector<Shape> shapes =
        large ? std::vector{Shape{16, 32}, Shape{15, 22}, Shape{1024, 4096}}
              : std::vector{Shape{8, 16}, Shape{7, 10}};
    Audit out;
    for (const DeviceMesh& mesh : meshes) {
      const int dims = mesh.ndim(), lists = placement_lists(letters, dims);
      auto list = [&](int code) { return placements_at(letters, dims, code); };
      for (const Shape& shape : shapes)
        for (int i = 0; i < lists; ++i)
          for (int j = 0; j < lists; ++j) audit(mesh, shape, list(i), list(j), objective, out);
    }
    fmt::print("{} of {} cases have a cheaper chain of per-mesh-dim steps ({} objective)\n",
               out.gaps, out.cases, mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plan_audit: %s\n", e.what());
    return 1;
  }
  return 0;
}
