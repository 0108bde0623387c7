// dtensor-plan: plans and explains the redistribution of a tensor between two layouts.
//   dtensor-plan --mesh 2x4 --shape 1024x4096 --dtype bf16 --from 'S(0),R' --to 'R,S(1)'
#include <dtensor/dtensor.hpp>
#include <dtensor/npy.hpp>
#include <dtensor/verify.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using namespace dtensor;

constexpr std::string_view usage =
    R"(usage: dtensor-plan --mesh 2x4 --shape 1024x4096 --from 'S(0),R' [--to 'R,S(1)'] [options]

Plans the redistribution of a tensor from one layout to another on a device mesh and explains
it: the steps, bytes per rank, estimated time and the ratio to the lower bound, with a
sharding picture of both layouts. Without --to, explains the one layout.

  --mesh 2x4             mesh extents, outermost first
  --shape 1024x4096      global tensor shape
  --from, --to 'S(0),R'  one placement per mesh dim: S(d) shards tensor dim d, R replicates,
                         P or P(sum|avg|max|min|product) holds partial values
  --dtype bf16           f32 (default), f64, f16, bf16, i32, i64, u8
  --names dp,tp          names of the mesh dims
  --balanced             uneven dims in pieces that differ by at most one (default: torch.chunk)
  --objective time       what to minimise: time (the cost model's, default) or bytes
  --padding auto         uneven steps: auto, always (pad to the largest piece) or never
  --memory auto          blocks held between steps: bounded (on every rank none larger than
                         the larger of its source and target blocks, where a plan allows; auto
                         padding then pads nothing), any, or auto (default: bounded where a
                         rank's larger block reaches 1 MiB, any below)
  --backend nccl         plan for this backend: nccl (packs strided pieces) or mpi (and the
                         simulator: moves them where they lie); where the plan seeks the memory
                         bound (--memory bounded, or auto from 1 MiB) and its scratch there passes
                         the larger of some rank's blocks, the fastest plan of either objective,
                         bounded or any, that stays within (auto: within 10% of the fastest;
                         plan_redistribute_for)
  --no-exchange          only per-mesh-dim collectives
  --no-all-to-all        no all-to-all: shard dim changes go through Replicate
  --exact-values         between layouts without Partial, steps that only move values (no
                         sum with zeros through P(sum), which turns -0.0 into +0.0)
  --backward             explain the gradient plan (PyTorch's rule) instead
  --grad 'R,S(1)'        the gradient's placements for --backward (default: --to's)
  --adjoint              explain the adjoint (transpose) plan instead
  --ranks-per-node 8     for the default cost model: inner mesh dims within a node use
                         NVLink-like links, the others network-like
  --execute              run the plan on simulated ranks (one thread each) with the global
                         tensor holding its own linear index, check every rank's result
                         against the target, and print verified (exit 1 when not)
  --dump DIR             with --execute: write DIR/rank<R>.src.npy and rank<R>.dst.npy
  --relabel              instead of a plan, the relabelling of ranks (which rank takes which
                         target block) that receives the fewest bytes, with the bytes received
                         before and after, per rank and in all; no Partial placements
  --to-mesh 4x2          with --relabel: the target's mesh (default: --mesh), with as many
                         ranks
  --relabel-method auto  with --relabel: auto (exact up to 512 ranks, else greedy), exact or
                         greedy
  --tensor SHAPE:DTYPE:FROM:TO
                         one tensor of a batch, e.g. --tensor '1024x256:bf16:S(0):R'; repeat
                         for every tensor (up to 64): explains the batched plan, whose rounds
                         move every tensor's step in one collective (instead of --shape,
                         --dtype, --from and --to; with --execute, runs it on simulated ranks)
  --schedule fused       with --tensor: how steps form rounds: fused (collectives fused where
                         the steps match, default) or fewest-calls (never more backend calls
                         than the busiest tensor alone)
  --json                 print the plan (or the relabelling) as JSON
  -h, --help             this text
)";

// A command-line mistake: reported on one line, exit code 2.
struct usage_error {
  std::string message;
};

struct Options {
  std::string mesh, shape, from, to, names, grad, dump, to_mesh, dtype = "f32";
  std::vector<std::string> tensors;  // --tensor SHAPE:DTYPE:FROM:TO
  bool balanced = false, json = false, backward = false, adjoint = false, help = false;
  bool execute = false, relabel = false;
  RelabelMethod relabel_method = RelabelMethod::automatic;
  bool relabel_method_given = false;
  BatchSchedule schedule = BatchSchedule::fused;
  bool schedule_given = false;
  PlanOptions plan;
  int ranks_per_node = 8;
  std::optional<detail::LinkAbilities> backend;  // --backend: its abilities
};

// The value of an option whose value is one of `choices` (spelling, value), or a usage error
// that lists them.
template <class T, std::size_t N>
T parse_choice(std::string_view option, std::string_view value,
               const std::pair<std::string_view, T> (&choices)[N]) {
  for (const auto& [spelling, v] : choices)
    if (value == spelling) return v;
  std::string names;
  for (std::size_t i = 0; i < N; ++i)
    names += fmt::format("{}{}", i == 0 ? "" : i + 1 == N ? " or " : ", ", choices[i].first);
  throw usage_error{fmt::format("{} is {}, got '{}'", option, names, value)};
}

int parse_int_option(std::string_view option, std::string_view value) {
  std::int64_t v = 0;
  if (!detail::parse_int(value, v) || v < 1 || v > 1 << 30)
    throw usage_error{fmt::format("{} needs a positive integer, got '{}'", option, value)};
  return static_cast<int>(v);
}

Options parse_args(int argc, char** argv) {
  Options o;
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (arg == "-h" || arg == "--help")
      o.help = true;
    else if (arg == "--balanced")
      o.balanced = true;
    else if (arg == "--json")
      o.json = true;
    else if (arg == "--backward")
      o.backward = true;
    else if (arg == "--adjoint")
      o.adjoint = true;
    else if (arg == "--execute")
      o.execute = true;
    else if (arg == "--relabel")
      o.relabel = true;
    else if (arg == "--no-exchange")
      o.plan.allow_exchange = false;
    else if (arg == "--no-all-to-all")
      o.plan.allow_all_to_all = false;
    else if (arg == "--exact-values")
      o.plan.exact_values = true;
    else {
      if (arg.substr(0, 2) != "--")
        throw usage_error{fmt::format("unexpected argument '{}' (see --help)", arg)};
      std::string_view value;
      const auto eq = arg.find('=');
      if (eq != std::string_view::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        throw usage_error{fmt::format("option {} needs a value", arg)};
      }
      if (arg == "--mesh")
        o.mesh = value;
      else if (arg == "--shape")
        o.shape = value;
      else if (arg == "--from")
        o.from = value;
      else if (arg == "--to")
        o.to = value;
      else if (arg == "--names")
        o.names = value;
      else if (arg == "--dtype")
        o.dtype = value;
      else if (arg == "--grad")
        o.grad = value;
      else if (arg == "--dump")
        o.dump = value;
      else if (arg == "--tensor")
        o.tensors.emplace_back(value);
      else if (arg == "--to-mesh")
        o.to_mesh = value;
      else if (arg == "--ranks-per-node")
        o.ranks_per_node = parse_int_option(arg, value);
      else if (arg == "--objective")
        o.plan.objective = parse_choice<Objective>(
            arg, value, {{"time", Objective::time}, {"bytes", Objective::bytes}});
      else if (arg == "--memory")
        o.plan.memory = parse_choice<Memory>(
            arg, value,
            {{"auto", Memory::automatic}, {"any", Memory::any}, {"bounded", Memory::bounded}});
      else if (arg == "--backend")
        o.backend = parse_choice<detail::LinkAbilities>(
            arg, value,
            {{"nccl", detail::packing_abilities},
             {"mpi", detail::abilities_of<detail::Link<SimulatedBackend>>}});
      else if (arg == "--padding")
        o.plan.padding = parse_choice<Padding>(
            arg, value,
            {{"auto", Padding::automatic}, {"always", Padding::always}, {"never", Padding::never}});
      else if (arg == "--schedule") {
        o.schedule_given = true;
        o.schedule = parse_choice<BatchSchedule>(
            arg, value,
            {{"fused", BatchSchedule::fused}, {"fewest-calls", BatchSchedule::fewest_calls}});
      } else if (arg == "--relabel-method") {
        o.relabel_method_given = true;
        o.relabel_method = parse_choice<RelabelMethod>(arg, value,
                                                       {{"auto", RelabelMethod::automatic},
                                                        {"exact", RelabelMethod::exact},
                                                        {"greedy", RelabelMethod::greedy}});
      } else {
        throw usage_error{fmt::format("unknown option '{}' (see --help)", arg)};
      }
    }
  }
  if (o.help) return o;
  if (o.mesh.empty()) throw usage_error{"--mesh is required, e.g. --mesh 2x4"};
  if (!o.tensors.empty()) {
    if (!o.shape.empty() || !o.from.empty() || !o.to.empty())
      throw usage_error{"--tensor replaces --shape, --from and --to"};
    if (o.json || o.backward || o.adjoint || o.relabel || !o.dump.empty())
      throw usage_error{"--tensor goes without --json, --backward, --adjoint, --relabel, --dump"};
    return o;
  }
  if (o.schedule_given) throw usage_error{"--schedule goes with --tensor"};
  if (o.shape.empty()) throw usage_error{"--shape is required, e.g. --shape 1024x4096"};
  if (o.from.empty()) throw usage_error{"--from is required, e.g. --from 'S(0),R'"};
  if (o.to.empty() && (o.backward || o.adjoint || o.json))
    throw usage_error{"--to is required with --backward, --adjoint and --json"};
  if (o.backward && o.adjoint) throw usage_error{"choose one of --backward and --adjoint"};
  if (!o.grad.empty() && !o.backward) throw usage_error{"--grad goes with --backward"};
  if (!o.dump.empty() && !o.execute) throw usage_error{"--dump goes with --execute"};
  if (o.backend && (o.backward || o.adjoint || o.relabel || !o.tensors.empty()))
    throw usage_error{"--backend goes without --backward, --adjoint, --relabel and --tensor"};
  if (o.execute && o.to.empty()) throw usage_error{"--execute needs --to"};
  if (o.relabel && o.to.empty()) throw usage_error{"--relabel needs --to"};
  if (o.relabel && (o.backward || o.adjoint || o.execute))
    throw usage_error{"--relabel goes without --backward, --adjoint and --execute"};
  if (!o.relabel && (!o.to_mesh.empty() || o.relabel_method_given))
    throw usage_error{"--to-mesh and --relabel-method go with --relabel"};
  return o;
}

DeviceMesh make_mesh(const Options& o) {
  const DeviceMesh plain = parse_mesh(o.mesh);
  if (o.names.empty()) return plain;
  std::vector<std::string_view> names;
  std::string_view rest = o.names;
  while (true) {
    const auto comma = rest.find(',');
    names.push_back(rest.substr(0, comma));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return DeviceMesh(plain.shape(), names);
}

void print_layout(std::string_view title, const Layout& l) {
  fmt::print("{}: {}\n", title, l);
  fmt::print("  {:>4}  {:<12} {:<20} {:<20} {:>12}\n", "rank", "coord", "offset", "shape", "bytes");
  for (int i = 0; i < l.mesh().size(); ++i) {
    const int rank = l.mesh().rank_at(i);
    fmt::print("  {:>4}  {:<12} {:<20} {:<20} {:>12}\n", rank, l.mesh().coordinate(rank),
               l.global_offset(rank), l.local_shape(rank), l.local_bytes(rank));
  }
  fmt::print("\n{}\n", sharding_picture(l));
}

// ["S(0)","R"]
std::string json_placements(const Placements& ps) {
  std::string out = "[";
  for (std::size_t i = 0; i < ps.size(); ++i) out += fmt::format("{}\"{}\"", i ? "," : "", ps[i]);
  return out + "]";
}

template <class V>
std::string json_list(const V& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += fmt::format("{}{}", i ? "," : "", v[i]);
  return out + "]";
}

// The plan's scratch on the strided backends (MPI, the simulator) and on a backend that packs
// (NCCL) against issue 5's bound.
struct MemoryReport {
  std::int64_t strided = 0;  // workspace_bytes<SimulatedBackend>: the busiest rank's
  bool within_ends = true;   // every rank's at most the larger of its source and target blocks
  bool packing_within_ends = true;  // the same on a backend that packs
  bool blocks_within_ends = true;
  std::vector<std::int64_t> per_rank;  // every global rank's workspace_bytes<SimulatedBackend>
  std::vector<std::int64_t> packing;   // every global rank's on a backend that packs
};

MemoryReport memory_report(const Plan& plan) {
  MemoryReport m;
  m.blocks_within_ends = blocks_within_ends(plan);
  const DeviceMesh& mesh = plan.src().mesh();
  for (int rank = 0; rank < mesh.size(); ++rank) {
    const std::int64_t ends = std::max(plan.src().local_bytes(rank), plan.dst().local_bytes(rank));
    const std::int64_t held = workspace_bytes<SimulatedBackend>(plan, rank);
    const std::int64_t packed =
        detail::rank_workspace_bytes(plan, mesh.coordinate(rank), 0, detail::packing_abilities);
    m.per_rank.push_back(held);
    m.packing.push_back(packed);
    m.strided = std::max(m.strided, held);
    m.within_ends = m.within_ends && held <= ends;
    m.packing_within_ends = m.packing_within_ends && packed <= ends;
  }
  return m;
}

void print_json(const Plan& plan, std::string_view kind) {
  const Layout& src = plan.src();
  const Layout& dst = plan.dst();
  const DeviceMesh& mesh = src.mesh();
  const MemoryReport m = memory_report(plan);
  std::string out = fmt::format(
      "{{\"kind\":\"{}\",\"mesh\":{},\"shape\":{},\"dtype\":\"{}\",\"elem_bytes\":{},", kind,
      json_list(mesh.shape()), json_list(src.global_shape()), src.dtype(), src.elem_bytes());
  if (mesh.has_names()) {
    out += "\"names\":[";
    for (int k = 0; k < mesh.ndim(); ++k)
      out += fmt::format("{}\"{}\"", k ? "," : "", mesh.name(k));
    out += "],";
  }
  out += fmt::format("\"from\":{},\"to\":{},\"steps\":[", json_placements(src.placements()),
                     json_placements(dst.placements()));
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Step& s = plan[i];
    std::string dims = "[";
    if (s.mesh_dim >= 0)
      dims += fmt::format("{}", s.mesh_dim);
    else
      for (int k = 0; k < mesh.ndim(); ++k) dims += fmt::format("{}{}", k ? "," : "", k);
    dims += "]";
    out += fmt::format(
        "{}{{\"op\":\"{}\",\"mesh_dims\":{},\"from\":{},\"to\":{},\"padded\":{},"
        "\"by_elements\":{},\"bytes_recv_max\":{},\"bytes_send_max\":{},\"est_us\":{:.4f}}}",
        i ? "," : "", name(s.kind), dims, json_placements(s.before), json_placements(s.after),
        s.padded, s.by_elements, s.bytes_recv_max, s.bytes_send_max, s.est_us);
  }
  out += fmt::format(
      "],\"bytes_recv_max\":{},\"bytes_send_max\":{},\"lower_bound_bytes_recv_max\":{},"
      "\"est_us\":{:.4f},\"workspace_bytes\":{},\"workspace_bytes_strided\":{},"
      "\"scratch_within_ends\":{},\"scratch_within_ends_packing\":{},\"blocks_within_ends\":{},"
      "\"memory_bounded\":{},\"runs_in_place\":{},\"ranks\":[",
      plan.bytes_recv_max(), plan.bytes_send_max(), plan.lower_bound_bytes_recv_max(),
      plan.est_us(), workspace_bytes(plan), m.strided, m.within_ends, m.packing_within_ends,
      m.blocks_within_ends, plan.memory_bounded(), runs_in_place(plan));
  for (int i = 0; i < mesh.size(); ++i) {
    const int rank = mesh.rank_at(i);

    const RankBytes bytes = rank_bytes(plan, rank);
    out += fmt::format(
        "{}{{\"rank\":{},\"coord\":{},\"src_offset\":{},\"src_shape\":{},\"dst_offset\":{},"
        "\"dst_shape\":{},\"bytes_recv\":{},\"bytes_send\":{},\"workspace_bytes\":{},"
        "\"workspace_bytes_strided\":{}}}",
        i ? "," : "", rank, json_list(mesh.coordinate(rank)), json_list(src.global_offset(rank)),
        json_list(src.local_shape(rank)), json_list(dst.global_offset(rank)),
        json_list(dst.local_shape(rank)), bytes.recv, bytes.send,
        m.packing[static_cast<std::size_t>(rank)], m.per_rank[static_cast<std::size_t>(rank)]);
  }
  out += "]}\n";
  fmt::print("{}", out);
}

// The relabelling of ranks from `src` to `dst`: in words and per target block, or as JSON.
int print_relabelling(const Layout& src, const Layout& dst, const Options& o) {
  const Relabelling r = find_relabelling(src, dst, o.relabel_method);
  const DeviceMesh& from = src.mesh();
  const DeviceMesh& to = dst.mesh();
  if (o.json) {
    std::string out = fmt::format(
        "{{\"kind\":\"relabel\",\"method\":\"{}\",\"mesh\":{},\"to_mesh\":{},\"shape\":{},"
        "\"dtype\":\"{}\",\"elem_bytes\":{},\"from\":{},\"to\":{},\"rank_for\":{},",
        r.method(), json_list(from.shape()), json_list(to.shape()), json_list(src.global_shape()),
        src.dtype(), src.elem_bytes(), json_placements(src.placements()),
        json_placements(dst.placements()), json_list(r.ranks()));
    out += fmt::format(
        "\"bytes_recv_max_before\":{},\"bytes_recv_max_after\":{},"
        "\"bytes_recv_total_before\":{},\"bytes_recv_total_after\":{},\"moves_nothing\":{},"
        "\"is_identity\":{}}}\n",
        r.bytes_recv_max_before(), r.bytes_recv_max_after(), r.bytes_recv_total_before(),
        r.bytes_recv_total_after(), r.moves_nothing(), r.is_identity());
    fmt::print("{}", out);
    return 0;
  }
  fmt::print("relabel: {} on mesh {} -> {} on mesh {}, shape {} {} ({} ranks, {})\n",
             src.placements(), from, dst.placements(), to, src.global_shape(), src.dtype(),
             r.size(), r.method());
  fmt::print("{}\n", describe(r));
  fmt::print("  {:>5}  {:>4}  {:<12} {:<12} {:>12} {:>12}\n", "block", "rank", "rank coord",
             "block coord", "recv before", "recv after");
  for (int q = 0; q < r.size(); ++q) {
    const int p = r.rank_for(q);
    fmt::print("  {:>5}  {:>4}  {:<12} {:<12} {:>12} {:>12}\n", q, from.rank_at(p),
               from.coordinate_at(p), to.coordinate_at(q), relabel_bytes_recv(src, dst, q, q),
               relabel_bytes_recv(src, dst, p, q));
  }
  fmt::print("total: recv max {} B (before {} B), in all {} B (before {} B)\n",
             r.bytes_recv_max_after(), r.bytes_recv_max_before(), r.bytes_recv_total_after(),
             r.bytes_recv_total_before());
  return 0;
}

// Runs the plan on simulated ranks against the global view; writes .npy files with --dump.
int execute_and_report(const Plan& plan, const Options& o, bool verbose) {
  const Verification v = verify_on_simulator(plan);
  const DeviceMesh& mesh = plan.src().mesh();
  if (!o.dump.empty() && !v.sources.empty()) {
    std::filesystem::create_directories(o.dump);
    for (int i = 0; i < mesh.size(); ++i) {
      const int rank = mesh.rank_at(i);
      const auto at = static_cast<std::size_t>(i);
      write_npy(fmt::format("{}/rank{}.src.npy", o.dump, rank), v.sources[at].data(),
                plan.src().local_shape(rank), plan.src().dtype());
      write_npy(fmt::format("{}/rank{}.dst.npy", o.dump, rank), v.results[at].data(),
                plan.dst().local_shape(rank), plan.dst().dtype());
    }
  }
  if (!v.verified) {
    fmt::print(stderr, "dtensor-plan: execution differs: {}\n", v.difference);
    return 1;
  }
  if (verbose) {
    std::int64_t recv_max = 0;
    for (const RankBytes& b : v.measured) recv_max = b.recv > recv_max ? b.recv : recv_max;
    fmt::print(
        "executed on {} simulated ranks: every rank's result equals its block of the "
        "target; measured recv max {} B, as planned\n",
        mesh.size(), recv_max);
    if (!o.dump.empty()) fmt::print("wrote {}/rank<R>.src.npy and rank<R>.dst.npy\n", o.dump);
  }
  fmt::print("verified\n");
  return 0;
}

// --tensor SHAPE:DTYPE:FROM:TO, e.g. 1024x256:bf16:S(0):R.
Redistribution parse_tensor(const DeviceMesh& mesh, std::string_view spec, ChunkPolicy policy) {
  std::vector<std::string_view> parts;
  for (std::string_view rest = spec;;) {
    const auto colon = rest.find(':');
    parts.push_back(rest.substr(0, colon));
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  if (parts.size() != 4)
    throw usage_error{fmt::format(
        "--tensor needs SHAPE:DTYPE:FROM:TO, e.g. 1024x256:bf16:S(0):R, got '{}'", spec)};
  const Shape shape = parse_shape(parts[0]);
  const DType dtype = parse_dtype(parts[1]);
  return {Layout(mesh, parse_placements(parts[2]), shape, dtype, policy),
          Layout(mesh, parse_placements(parts[3]), shape, dtype, policy)};
}

// Several --tensor: the batched plan, explained (and with --execute, run and checked).
int run_batch(const Options& o, const DeviceMesh& mesh, ChunkPolicy policy) {
  std::vector<Redistribution> tensors;
  for (const std::string& spec : o.tensors) tensors.push_back(parse_tensor(mesh, spec, policy));
  const auto batch = std::make_unique<BatchPlan<>>(plan_batch(tensors, o.plan, o.schedule));
  fmt::print("{}", explain(*batch));
  if (!o.execute) return 0;
  const BatchVerification v = verify_batch_on_simulator(*batch);
  if (!v.verified) {
    fmt::print("NOT verified: {}\n", v.difference);
    return 1;
  }
  fmt::print(
      "verified: every tensor on every rank of {} simulated ranks equals its target "
      "block; {} backend calls (one per group and round); bytes as planned\n",
      mesh.size(), v.collectives);
  return 0;
}

int run(Options o) {
  const DeviceMesh mesh = make_mesh(o);
  if (!o.tensors.empty()) {
    o.plan = o.plan.with_cost_model(CostModel::defaults(mesh, o.ranks_per_node));
    return run_batch(o, mesh, o.balanced ? ChunkPolicy::balanced : ChunkPolicy::torch_chunk);
  }
  const Shape shape = parse_shape(o.shape);
  const DType dtype = parse_dtype(o.dtype);
  const ChunkPolicy policy = o.balanced ? ChunkPolicy::balanced : ChunkPolicy::torch_chunk;
  const Layout src(mesh, parse_placements(o.from), shape, dtype, policy);
  if (o.to.empty()) {
    print_layout("layout", src);
    return 0;
  }
  if (o.relabel) {
    const DeviceMesh to_mesh = o.to_mesh.empty() ? mesh : parse_mesh(o.to_mesh);
    return print_relabelling(src, Layout(to_mesh, parse_placements(o.to), shape, dtype, policy), o);
  }
  const Layout dst(mesh, parse_placements(o.to), shape, dtype, policy);
  o.plan = o.plan.with_cost_model(CostModel::defaults(mesh, o.ranks_per_node));
  std::string_view kind = "forward";
  Plan plan = o.backend ? detail::plan_within_ends(src, dst, o.plan, *o.backend)
                        : plan_redistribute(src, dst, o.plan);
  if (o.backward) {
    kind = "backward";
    const Placements grad = o.grad.empty() ? dst.placements() : parse_placements(o.grad);
    plan = plan_backward(src, dst, grad, o.plan);
  } else if (o.adjoint) {
    kind = "adjoint";
    plan = plan_adjoint(src, dst, o.plan);
  }
  if (o.json) {
    print_json(plan, kind);
    return o.execute ? execute_and_report(plan, o, false) : 0;
  }
  if (kind != "forward")
    fmt::print("{} plan of {} -> {}\n", kind, src.placements(), dst.placements());
  fmt::print("{}", explain(plan));
  const MemoryReport m = memory_report(plan);
  fmt::print(
      "memory: scratch at most {} per rank (any backend), {} on MPI and the simulator ({} the "
      "larger of each rank's source and target blocks there); blocks between steps {}; planned "
      "{}{}\n\n",
      human_bytes(workspace_bytes(plan)), human_bytes(m.strided), m.within_ends ? "within" : "over",
      m.blocks_within_ends ? "within both ends" : "larger than both ends on some rank",
      plan.memory_bounded() ? "within the memory bound" : "for speed, scratch unbounded",
      runs_in_place(plan) ? "; runs in place (one buffer for source and target)" : "");
  print_layout("from", plan.src());
  print_layout("to", plan.dst());
  return o.execute ? execute_and_report(plan, o, true) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse_args(argc, argv);
    if (o.help) {
      fmt::print("{}", usage);
      return 0;
    }
    return run(o);
  } catch (const usage_error& e) {
    fmt::print(stderr, "dtensor-plan: {}\n", e.message);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dtensor-plan: {}\n", e.what());
  }
  return 2;
}
