// libFuzzer target: text spellings through the parser, the planner and a simulated run.
//
// An input is up to six lines (docs/fuzzing.md):
//   mesh     "2x4"
//   shape    "8x16"
//   dtype    "f32"
//   from     "S(0),R"
//   to       "R,S(1)"
//   options  words: bytes time always never auto no-exchange no-all-to-all balanced keep-one
//            backward adjoint batch; any other word's bytes set option bits.
// The lines go to the parser as spelled, then (when they parse) into layouts, plans and, when
// small, a run on simulated ranks checked against the global view. Whatever did not parse or
// was too large to run is then replaced by values derived from its bytes, so that most inputs
// reach the planner and the executor.
//
// The contract: parsing, building layouts and planning either succeed or throw dtensor::error;
// a plan's steps chain from the source's placements to the target's, each collective step is a
// valid group operation, no plan moves less than the lower bound, and a small plan runs on the
// simulator to exactly the target's blocks. Anything else prints what happened and aborts.
//
// Built with clang and -DDTENSOR_LIBFUZZER it is a libFuzzer target; otherwise main() replays
// the files (or every file of the directories) given on the command line.
#include <dtensor/dtensor.hpp>
#include <dtensor/verify.hpp>

#include "../packing_backend.hpp"
#include "../simulated_worlds.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef DTENSOR_LIBFUZZER
#include <filesystem>
#include <fstream>
#endif

namespace {

using namespace dtensor;

// Limits that keep one input fast.
constexpr int max_plan_ranks = 512;           // larger meshes are parsed and laid out only
constexpr int max_run_ranks = 8;              // simulated ranks (one thread each)
constexpr int max_wide_ranks = 64;            // the wide mesh of pass 3 (planned, not run)
constexpr std::int64_t max_run_numel = 4096;  // elements of the global tensor for a run
constexpr std::int64_t max_check_ranks = 64;  // per-rank byte totals recomputed up to this

// Prints what broke and the input's context, then aborts so that libFuzzer saves the input.
[[noreturn]] void violation(std::string_view what, std::string_view context) {
  fmt::print(stderr, "\nfuzz_redistribute: CONTRACT VIOLATED: {}\n{}\n", what, context);
  std::fflush(stderr);
  std::abort();
}

// f() or nothing when it throws dtensor::error about the input; any other exception, or an
// "internal error" (the library's own failure, not the input's), breaks the contract.
template <class F>
auto guarded(std::string_view stage, std::string_view context, F&& f)
    -> std::optional<decltype(f())> {
  try {
    return f();
  } catch (const dtensor::error& e) {
    if (std::string_view(e.what()).starts_with("internal error"))
      violation(fmt::format("{} failed: {}", stage, e.what()), context);
    return std::nullopt;
  } catch (const std::exception& e) {
    violation(fmt::format("{} threw a non-dtensor exception: {}", stage, e.what()), context);
  } catch (...) {
    violation(fmt::format("{} threw something that is not an exception", stage), context);
  }
}

// f() must not throw at all.
template <class F>
auto must_succeed(std::string_view stage, std::string_view context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    violation(fmt::format("{} threw: {}", stage, e.what()), context);
  } catch (...) {
    violation(fmt::format("{} threw something that is not an exception", stage), context);
  }
}

// The input's lines.
struct Fields {
  std::string_view mesh, shape, dtype, from, to, options;
};

Fields split_fields(std::string_view text) {
  std::string_view* fields[6];
  Fields f;
  fields[0] = &f.mesh;
  fields[1] = &f.shape;
  fields[2] = &f.dtype;
  fields[3] = &f.from;
  fields[4] = &f.to;
  fields[5] = &f.options;
  for (std::string_view* field : fields) {
    const auto eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    *field = line;
    if (eol == std::string_view::npos) break;
    text.remove_prefix(eol + 1);
  }
  return f;
}

// A stream of bytes derived from one field: its own bytes first, then a generator seeded with
// its hash, so a change to the field changes what is derived from it.
class ByteSource {
 public:
  ByteSource(std::string_view field, std::uint64_t salt) : bytes_(field) {
    state_ = 1469598103934665603ull ^ salt;
    for (char c : field) state_ = (state_ ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    if (state_ == 0) state_ = 1;
  }
  unsigned next() {
    if (at_ < bytes_.size()) return static_cast<unsigned char>(bytes_[at_++]);
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return static_cast<unsigned>(state_ >> 24) & 0xffu;
  }
  // A value in [0, n).
  int below(int n) { return static_cast<int>(next() % static_cast<unsigned>(n)); }

 private:
  std::string_view bytes_;
  std::size_t at_ = 0;
  std::uint64_t state_;
};

// The options line.
struct Options {
  PlanOptions plan;
  ChunkPolicy policy = ChunkPolicy::torch_chunk;
  bool backward = false;
  bool adjoint = false;
  bool batch = false;  // also run {src -> dst, dst -> src, src -> dst} as one batched plan
};

Options parse_options(std::string_view line) {
  Options o;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= line.size(); ++i) {
    if (i < line.size() && line[i] != ' ' && line[i] != ',' && line[i] != '\t') continue;
    const std::string_view word = line.substr(start, i - start);
    start = i + 1;
    if (word.empty()) continue;
    if (word == "bytes")
      o.plan.objective = Objective::bytes;
    else if (word == "time")
      o.plan.objective = Objective::time;
    else if (word == "always")
      o.plan.padding = Padding::always;
    else if (word == "never")
      o.plan.padding = Padding::never;
    else if (word == "auto")
      o.plan.padding = Padding::automatic;
    else if (word == "no-exchange")
      o.plan.allow_exchange = false;
    else if (word == "no-all-to-all")
      o.plan.allow_all_to_all = false;
    else if (word == "balanced")
      o.policy = ChunkPolicy::balanced;
    else if (word == "keep-one")
      o.plan.partial_from_replicate = PartialFromReplicate::keep_one;
    else if (word == "bounded")
      o.plan.memory = Memory::bounded;
    else if (word == "any")
      o.plan.memory = Memory::any;
    else if (word == "seek")  // Memory::automatic seeks the bound on any block
      o.plan.bounded_from_bytes = 0;
    else if (word == "backward")
      o.backward = true;
    else if (word == "adjoint")
      o.adjoint = true;
    else if (word == "batch")
      o.batch = true;
    else if (word == "exact")
      o.plan.exact_values = true;
    else {
      // Unknown words still choose options, so that mutated bytes explore them.
      const auto b = static_cast<unsigned char>(word[0]);
      if (b & 1u) o.plan.objective = Objective::bytes;
      if (b & 2u) o.plan.padding = Padding::always;
      if (b & 4u) o.plan.padding = Padding::never;
      if (b & 8u) o.plan.allow_exchange = false;
      if (b & 16u) o.plan.allow_all_to_all = false;
      if (b & 32u) o.policy = ChunkPolicy::balanced;
      if (b & 64u) o.plan.partial_from_replicate = PartialFromReplicate::keep_one;
      if (b & 128u) o.backward = true;
      if (word.size() > 1 && (static_cast<unsigned char>(word[1]) & 1u)) o.adjoint = true;
      if (word.size() > 1 && (static_cast<unsigned char>(word[1]) & 2u)) o.batch = true;
      if (word.size() > 1 && (static_cast<unsigned char>(word[1]) & 4u))
        o.plan.memory = Memory::bounded;
      if (word.size() > 1 && (static_cast<unsigned char>(word[1]) & 8u))
        o.plan.bounded_from_bytes = 0;
      if (word.size() > 1 && (static_cast<unsigned char>(word[1]) & 16u))
        o.plan.exact_values = true;
    }
  }
  return o;
}

// Whether the shape has at most `limit` elements (without overflowing on huge shapes).
bool numel_at_most(const Shape& s, std::int64_t limit) {
  std::int64_t n = 1;
  for (std::int64_t e : s) {
    if (e == 0) return true;
    if (e < 0 || e > limit) return false;
    n *= e;
    if (n > limit) {
      for (std::int64_t rest : s)
        if (rest == 0) return true;
      return false;
    }
  }
  return true;
}

std::string shape_text(const Shape& s) {
  std::string out;
  for (std::size_t d = 0; d < s.size(); ++d) out += fmt::format("{}{}", d ? "x" : "", s[d]);
  return out;
}

std::string options_text(const Options& o) {
  return fmt::format(
      "objective={} padding={} exchange={} all_to_all={} policy={} partial_from_replicate={} "
      "backward={} adjoint={} batch={} memory={} bounded_from_bytes={} exact_values={}",
      o.plan.objective == Objective::bytes ? "bytes" : "time",
      o.plan.padding == Padding::always  ? "always"
      : o.plan.padding == Padding::never ? "never"
                                         : "auto",
      o.plan.allow_exchange, o.plan.allow_all_to_all, o.policy,
      o.plan.partial_from_replicate == PartialFromReplicate::keep_one ? "keep_one" : "divide",
      o.backward, o.adjoint, o.batch,
      o.plan.memory == Memory::bounded ? "bounded"
      : o.plan.memory == Memory::any   ? "any"
                                       : "auto",
      o.plan.bounded_from_bytes, o.plan.exact_values);
}

// Whether every ')' closes an earlier '(' and every '(' is closed.
bool balanced(std::string_view text) {
  int depth = 0;
  for (char c : text) {
    depth += c == '(' ? 1 : c == ')' ? -1 : 0;
    if (depth < 0) return false;
  }
  return depth == 0;
}

// A parsed value must read back from its own spelling.
void check_round_trips(const std::optional<DeviceMesh>& mesh, const std::optional<Shape>& shape,
                       const std::optional<DType>& dtype, const std::optional<Placements>& from,
                       const std::optional<Placements>& to, std::string_view context) {
  if (mesh) {
    const std::string text = fmt::format("{}", *mesh);
    if (!(must_succeed("parse_mesh(formatted mesh)", context, [&] { return parse_mesh(text); }) ==
          *mesh))
      violation(fmt::format("mesh {} does not read back", text), context);
  }
  if (shape && !shape->empty()) {
    const std::string text = shape_text(*shape);
    if (!(must_succeed("parse_shape(formatted shape)", context,
                       [&] { return parse_shape(text); }) == *shape))
      violation(fmt::format("shape {} does not read back", text), context);
  }
  if (dtype && must_succeed("parse_dtype(name)", context,
                            [&] { return parse_dtype(name(*dtype)); }) != *dtype)
    violation(fmt::format("dtype {} does not read back", name(*dtype)), context);
  for (const auto* ps : {&from, &to}) {
    if (!*ps) continue;
    if (ps->value().empty()) violation("parse_placements returned an empty list", context);
    const std::string text = fmt::format("{}", **ps);
    if (!(must_succeed("parse_placements(formatted placements)", context,
                       [&] { return parse_placements(text); }) == **ps))
      violation(fmt::format("placements {} do not read back", text), context);
  }
}

// The plan's invariants (see tests/planner_test.cpp's exhaustive test).
void check_plan(const Plan& plan, const Options& o, std::string_view what,
                std::string_view context) {
  const std::string ctx = fmt::format("{}\n{}: {} -> {}", context, what, plan.src(), plan.dst());
  auto explained = [&] {
    return guarded("explain", ctx, [&] { return explain(plan); }).value_or("(explain threw)");
  };
  auto fail = [&](std::string_view why) {
    violation(why, fmt::format("{}\n{}", ctx, explained()));
  };
  const Layout& src = plan.src();
  const Layout& dst = plan.dst();
  const DeviceMesh& mesh = src.mesh();
  Placements state = src.placements();
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Step& s = plan[i];
    if (!(s.before == state))
      fail(fmt::format("step {} starts from {}, not from the previous step's {}", i, s.before,
                       state));
    if (s.before.size() != state.size() || s.after.size() != state.size())
      fail(fmt::format("step {} has placements of the wrong length", i));
    if (s.kind == StepKind::exchange) {
      if (s.mesh_dim != -1) fail(fmt::format("exchange step {} names mesh dim {}", i, s.mesh_dim));
    } else {
      if (s.mesh_dim < 0 || s.mesh_dim >= mesh.ndim())
        fail(fmt::format("step {} runs on mesh dim {} of a {}-dim mesh", i, s.mesh_dim,
                         mesh.ndim()));
      if (!must_succeed("transition_valid", ctx,
                        [&] { return detail::transition_valid(s.mesh_dim, s.before, s.after); }))
        fail(fmt::format("step {} ({} on mesh dim {}) is not a valid group operation", i,
                         name(s.kind), s.mesh_dim));
    }
    if (s.bytes_recv_max < 0 || s.bytes_send_max < 0 || !(s.est_us >= 0) ||
        !std::isfinite(s.est_us))
      fail(fmt::format("step {} has negative or non-finite costs", i));
    if (s.bytes_recv_max > plan.bytes_recv_max() || s.bytes_send_max > plan.bytes_send_max())
      fail(fmt::format("step {} moves more than the whole plan", i));
    state = s.after;
  }
  if (!(state == dst.placements()))
    fail(fmt::format("the steps end at {}, not at the target {}", state, dst.placements()));
  if (!(plan.est_us() >= 0) || !std::isfinite(plan.est_us()))
    fail("the plan's estimated time is negative or not finite");
  const std::int64_t bound = plan.lower_bound_bytes_recv_max();
  if (bound < 0) fail("negative lower bound");
  if (plan.bytes_recv_max() < bound)
    fail(fmt::format("the plan receives {} B on its busiest rank, below the lower bound {} B",
                     plan.bytes_recv_max(), bound));
  // docs/planner.md: under Objective::bytes, no Partial on either side moves exactly the bound.
  if (o.plan.objective == Objective::bytes && o.plan.padding == Padding::automatic &&
      o.plan.allow_exchange && o.plan.allow_all_to_all && !has_partial(src.placements()) &&
      !has_partial(dst.placements()) && plan.bytes_recv_max() != bound)
    fail(fmt::format("Objective::bytes without Partial moves {} B, not the lower bound {} B",
                     plan.bytes_recv_max(), bound));
  // docs/planner.md: under PlanOptions::exact_values, no Partial on either side passes through
  // none.
  if (o.plan.exact_values && !has_partial(src.placements()) && !has_partial(dst.placements()))
    for (const Step& s : plan)
      if (has_partial(s.after))
        fail(fmt::format("exact_values without Partial passes through {}", s.after));
  // docs/planner.md: under Memory::bounded, no Partial on either side holds no block between
  // steps larger than both ends.
  if (o.plan.memory == Memory::bounded && o.plan.allow_exchange && !o.backward && !o.adjoint &&
      !has_partial(src.placements()) && !has_partial(dst.placements()) &&
      mesh.size() <= max_check_ranks &&
      !must_succeed("blocks_within_ends", ctx, [&] { return blocks_within_ends(plan); }))
    fail("Memory::bounded without Partial holds a block larger than both ends");
  // docs/planner.md: Memory::automatic's plan runs bounded only where it holds the bound.
  if (o.plan.memory == Memory::automatic && plan.memory_bounded() &&
      mesh.size() <= max_check_ranks &&
      !must_succeed("blocks_within_ends", ctx, [&] { return blocks_within_ends(plan); }))
    fail("Memory::automatic chose the bound for a plan holding a block larger than both ends");
  if (plan.options().memory != o.plan.memory)
    fail("the plan's options do not keep the memory mode asked for");
  if (mesh.size() <= max_check_ranks) {
    RankBytes most;
    for (int i = 0; i < mesh.size(); ++i) {
      const RankBytes b =
          must_succeed("rank_bytes", ctx, [&] { return rank_bytes(plan, mesh.rank_at(i)); });
      most.recv = std::max(most.recv, b.recv);
      most.send = std::max(most.send, b.send);
    }
    if (most.recv != plan.bytes_recv_max() || most.send != plan.bytes_send_max())
      fail(
          fmt::format("per-rank totals give recv max {} B and send max {} B, the plan says {} B "
                      "and {} B",
                      most.recv, most.send, plan.bytes_recv_max(), plan.bytes_send_max()));
  }
  must_succeed("explain", ctx, [&] { return explain(plan); });
}

using testing::PackingBackend;

// Runs a small plan on simulated ranks through backend kind B: every rank must hold its target
// block, bytes as planned, and the scratch it held must be what workspace_bytes<B> plans for it.
template <class B>
void run_on_backend(const Plan& plan, std::string_view what, std::string_view context) {
  const Layout& src = plan.src();
  const DeviceMesh& mesh = src.mesh();
  const std::string ctx = fmt::format(
      "{}\n{} on {}: {} -> {}", context, what,
      std::is_same_v<B, SimulatedBackend> ? "the simulator" : "a packing backend", src, plan.dst());
  SimulatedWorld& world = testing::world_of(mesh);
  std::vector<std::int64_t> held(static_cast<std::size_t>(mesh.size()));
  const Verification v = must_succeed("execute", ctx, [&] {
    return detail::visit_dtype(src.dtype(), [&]<class T>() {
      return detail::verify_typed<T>(
          plan, [&](const Plan& p, std::vector<std::vector<T>>& in,
                    std::vector<std::vector<T>>& out, std::vector<RankBytes>& measured) {
            detail::run_on_simulator<T, B>(world, p, in, out, measured, &held);
          });
    });
  });
  if (!v.verified)
    violation(fmt::format("the run differs from the global view: {}", v.difference),
              fmt::format("{}\n{}", ctx, explain(plan)));
  for (int i = 0; i < mesh.size(); ++i) {
    const int rank = mesh.rank_at(i);
    const std::int64_t planned = workspace_bytes<B>(plan, rank);
    if (held[static_cast<std::size_t>(i)] != planned)
      violation(fmt::format("rank {} held {} bytes of scratch where {} were planned", rank,
                            held[static_cast<std::size_t>(i)], planned),
                fmt::format("{}\n{}", ctx, explain(plan)));
  }
}

// Runs a small plan on the simulator (run_on_backend). Returns whether it was small enough.
bool run_plan(const Plan& plan, std::string_view what, std::string_view context) {
  const Layout& src = plan.src();
  if (src.mesh().size() > max_run_ranks || src.global_numel() > max_run_numel) return false;
  run_on_backend<SimulatedBackend>(plan, what, context);
  return true;
}

// Where the plan seeks the memory bound, plan_redistribute_for<B>: the plain plan where it is
// within the larger end on every rank on B, else one that is (or the plain plan where none is);
// a plan that differs must be within, pass check_plan under its own options, and run on both
// kinds of backend with the scratch planned.
template <class B>
void plan_for_backend(const Layout& src, const Layout& dst, const Plan& plain, const Options& o,
                      std::string_view context) {
  const std::string ctx = fmt::format("{}\nplan_redistribute_for: {} -> {}", context, src, dst);
  auto plan = guarded("plan_redistribute_for", ctx,
                      [&] { return plan_redistribute_for<B>(src, dst, o.plan); });
  if (!plan) violation("plan_redistribute_for threw where plan_redistribute did not", ctx);
  const bool within =
      must_succeed("scratch_within_ends", ctx, [&] { return scratch_within_ends<B>(plain); });
  if (*plan == plain) return;
  if (within) violation("plan_redistribute_for replaced a plan within the ends", ctx);
  if (!must_succeed("scratch_within_ends", ctx, [&] { return scratch_within_ends<B>(*plan); }))
    violation("plan_redistribute_for returned another plan that is not within the ends",
              fmt::format("{}\n{}", ctx, explain(*plan)));
  Options own = o;
  own.plan = plan->options();
  check_plan(*plan, own, "for the backend", context);
  if (run_plan(*plan, "for the backend", context))
    run_on_backend<PackingBackend>(*plan, "for the backend", context);
}

// Runs {src -> dst, dst -> src, src -> dst} as one batched plan on simulated ranks: every
// tensor must reach its target, bytes as planned, each tensor's plan the one planned alone (with
// no exchange from a Partial, which a batch's rounds do not run), and no more collectives than
// the tensors one by one.
bool run_batch(const Layout& src, const Layout& dst, const Options& o, std::string_view context) {
  const std::vector<Redistribution> tensors{{src, dst}, {dst, src}, {src, dst}};
  const std::string ctx = fmt::format("{}\nbatch: {} <-> {}", context, src, dst);
  auto batch = guarded("plan_batch", ctx, [&] { return plan_batch<3>(tensors, o.plan); });
  if (!batch) return false;
  for (std::size_t t = 0; t < tensors.size(); ++t)
    if (!((*batch)[t] == detail::plan_redistribute(tensors[t].src, tensors[t].dst, o.plan, false)))
      violation(fmt::format("tensor {}'s plan in the batch differs from its plan alone", t), ctx);
  if (batch->collectives() > batch->collectives_unbatched())
    violation(fmt::format("the batch has {} rounds, more than the {} steps one by one",
                          batch->collectives(), batch->collectives_unbatched()),
              ctx);
  const BatchVerification v = must_succeed("verify_batch_on_simulator", ctx,
                                           [&] { return testing::verified_batch(*batch); });
  if (!v.verified)
    violation(fmt::format("the batched run differs: {}", v.difference),
              fmt::format("{}\n{}", ctx, explain(*batch)));
  return true;
}

// Plans src -> dst (and the backward and adjoint plans when asked), checks every plan and runs
// the small ones. Returns whether a plan ran on the simulator.
bool plan_and_run(const Layout& src, const Layout& dst, const Options& o,
                  std::string_view context) {
  if (src.mesh().size() > max_plan_ranks) return false;
  bool ran = false;
  if (auto plan = guarded("plan_redistribute", context,
                          [&] { return plan_redistribute(src, dst, o.plan); })) {
    check_plan(*plan, o, "forward", context);
    ran = run_plan(*plan, "forward", context);
    // Where the plan seeks the memory bound: it runs on a backend that packs with the scratch
    // planned, and plan_redistribute_for finds one within the ends on each kind of backend.
    if (o.plan.memory == Memory::bounded ||
        (o.plan.memory == Memory::automatic && detail::seeks_bound(src, dst, o.plan))) {
      if (ran) run_on_backend<PackingBackend>(*plan, "forward", context);
      plan_for_backend<SimulatedBackend>(src, dst, *plan, o, context);
      plan_for_backend<PackingBackend>(src, dst, *plan, o, context);
    }
  }
  if (o.backward)
    if (auto plan =
            guarded("plan_backward", context, [&] { return plan_backward(src, dst, o.plan); })) {
      check_plan(*plan, o, "backward", context);
      ran = run_plan(*plan, "backward", context) || ran;
    }
  if (o.adjoint)
    if (auto plan =
            guarded("plan_adjoint", context, [&] { return plan_adjoint(src, dst, o.plan); })) {
      check_plan(*plan, o, "adjoint", context);
      ran = run_plan(*plan, "adjoint", context) || ran;
    }
  if (o.batch && src.mesh().size() <= max_run_ranks && src.global_numel() <= max_run_numel)
    ran = run_batch(src, dst, o, context) || ran;
  return ran;
}

// Values derived from bytes, small enough to run (meshes: at most `most_dims` dims and
// `most_ranks` ranks).
DeviceMesh derive_mesh(ByteSource& b, int most_dims = 4, int most_ranks = max_run_ranks) {
  const int ndim = 1 + b.below(most_dims);
  MeshShape extents;
  int size = 1;
  for (int k = 0; k < ndim; ++k) {
    int e = 1 + b.below(4);
    while (size * e > most_ranks) --e;
    extents.push_back(e);
    size *= e;
  }
  return DeviceMesh(extents);
}

Shape derive_shape(ByteSource& b) {
  const int ndim = 1 + b.below(4);
  Shape s;
  std::int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    std::int64_t e = b.below(13);
    while (e > 1 && numel * e > max_run_numel) --e;
    s.push_back(e);
    numel *= e > 0 ? e : 1;
  }
  return s;
}

Placements derive_placements(ByteSource& b, int mesh_ndim, int tensor_ndim, DType dtype) {
  Placements ps;
  for (int k = 0; k < mesh_ndim; ++k) {
    const int kind = b.below(6);
    if (kind < 2 || tensor_ndim == 0) {
      ps.push_back(Placement::replicate());
    } else if (kind < 4) {
      const int d = b.below(2 * tensor_ndim) - tensor_ndim;  // negative dims count from the end
      ps.push_back(Placement::shard(d));
    } else {
      ReduceOp op = all_reduce_ops[b.below(5)];
      if (op == ReduceOp::avg && !is_floating(dtype)) op = ReduceOp::sum;
      ps.push_back(Placement::partial(op));
    }
  }
  return ps;
}

// The layouts of a pair derived from the input's bytes (`pass` names it), which must be
// accepted, planned and run as plan_and_run does.
void plan_derived(std::string_view pass, const DeviceMesh& m, const Shape& s, DType t,
                  const Placements& a, const Placements& c, const Options& o,
                  std::string_view spelled) {
  const std::string context = fmt::format("{}\n{}: mesh {} shape {} dtype {} from {} to {}",
                                          spelled, pass, m, shape_text(s), name(t), a, c);
  const auto src = guarded(fmt::format("Layout ({} from)", pass), context,
                           [&] { return Layout(m, a, s, t, o.policy); });
  const auto dst = guarded(fmt::format("Layout ({} to)", pass), context,
                           [&] { return Layout(m, c, s, t, o.policy); });
  if (!src || !dst) violation(fmt::format("a {} layout was refused", pass), context);
  plan_and_run(*src, *dst, o, context);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const Fields f = split_fields(text);
  const Options o = parse_options(f.options);
  const std::string spelled =
      fmt::format("input: mesh '{}' shape '{}' dtype '{}' from '{}' to '{}' options '{}'\n({})",
                  f.mesh, f.shape, f.dtype, f.from, f.to, f.options, options_text(o));

  // 1. The spellings as given.
  const auto mesh = guarded("parse_mesh", spelled, [&] { return parse_mesh(f.mesh); });
  const auto shape = guarded("parse_shape", spelled, [&] { return parse_shape(f.shape); });
  const auto dtype = guarded("parse_dtype", spelled, [&] { return parse_dtype(f.dtype); });
  const auto from = guarded("parse_placements", spelled, [&] { return parse_placements(f.from); });
  const auto to = guarded("parse_placements", spelled, [&] { return parse_placements(f.to); });
  // A list that parses has balanced parentheses: nothing of it was left unread.
  for (const auto& [text, ps] : {std::pair{f.from, &from}, std::pair{f.to, &to}})
    if (*ps && !balanced(text))
      violation(
          fmt::format("parse_placements accepted '{}' (unbalanced parentheses) as {}", text, **ps),
          spelled);
  check_round_trips(mesh, shape, dtype, from, to, spelled);

  // 2. Layouts and plans from the parsed values.
  bool ran = false;
  std::optional<Layout> src, dst;
  if (mesh && shape && dtype && from) {
    src = guarded("Layout (from)", spelled,
                  [&] { return Layout(*mesh, *from, *shape, *dtype, o.policy); });
    if (src && src->mesh().size() <= max_check_ranks)
      must_succeed("sharding_picture", spelled, [&] { return sharding_picture(*src); });
  }
  if (mesh && shape && dtype && to)
    dst = guarded("Layout (to)", spelled,
                  [&] { return Layout(*mesh, *to, *shape, *dtype, o.policy); });
  if (src && dst) ran = plan_and_run(*src, *dst, o, spelled);

  // 3. What did not parse or was too large to run, derived from the bytes instead.
  if (!ran) {
    ByteSource mb(f.mesh, 1), sb(f.shape, 2), db(f.dtype, 3), fb(f.from, 4), tb(f.to, 5);
    const DeviceMesh m = mesh && mesh->size() <= max_run_ranks ? *mesh : derive_mesh(mb);
    Shape s = shape && numel_at_most(*shape, max_run_numel) ? *shape : derive_shape(sb);
    const DType t = dtype ? *dtype : all_dtypes[db.below(static_cast<int>(std::size(all_dtypes)))];
    const int nd = static_cast<int>(s.size());
    auto placements = [&](const std::optional<Layout>& l, const std::optional<Placements>& ps,
                          ByteSource& b) {
      if (l && ps && l->mesh() == m && l->global_shape() == s) return *ps;
      return derive_placements(b, m.ndim(), nd, t);
    };
    plan_derived("derived", m, s, t, placements(src, from, fb), placements(dst, to, tb), o,
                 spelled);
  }

  // 4. A wider mesh from the same bytes (up to 8 dims and max_wide_ranks ranks), planned and
  // checked, and run only where it is small: the planner's paths on many mesh dims.
  {
    ByteSource mb(f.mesh, 6), sb(f.shape, 7), db(f.dtype, 8), fb(f.from, 9), tb(f.to, 10);
    const DeviceMesh m = derive_mesh(mb, max_mesh_dims, max_wide_ranks);
    const Shape s = derive_shape(sb);
    const DType t = all_dtypes[db.below(static_cast<int>(std::size(all_dtypes)))];
    const int nd = static_cast<int>(s.size());
    plan_derived("wide", m, s, t, derive_placements(fb, m.ndim(), nd, t),
                 derive_placements(tb, m.ndim(), nd, t), o, spelled);
  }
  return 0;
}

#ifndef DTENSOR_LIBFUZZER
// Without libFuzzer: replays the given files, or every file of the given directories.
int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc < 2) {
    fmt::print(stderr, "usage: {} FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      inputs.push_back(p);
    } else {
      fmt::print(stderr, "{}: no such file or directory\n", p.string());
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  for (const fs::path& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fmt::print("{}\n", p.string());
    std::fflush(stdout);
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  fmt::print("replayed {} inputs\n", inputs.size());
  return 0;
}
#endif
