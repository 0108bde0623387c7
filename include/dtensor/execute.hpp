#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "backend.hpp"
#include "detail/in_flight.hpp"
#include "detail/step_cost.hpp"
#include "detail/step_runners.hpp"
#include "detail/why.hpp"
#include "errors.hpp"
#include "plan.hpp"
#include "planner.hpp"

// Running a plan on real buffers: every rank calls execute() with its own backend and its
// blocks of the source and target layouts (row-major, contiguous), in the backend's memory.
namespace dtensor {

namespace detail {

// A backend that packs strided pieces (NCCL): no strided collectives, local ops that fill in
// place (cuda::DeviceOps, like HostOps).
inline constexpr LinkAbilities packing_abilities{.fills_in_place = true};

// The scratch run_plan holds at most on the rank at `me` (place_blocks), with the steps whose
// bit is set in `point_to_point` run as messages, over a link with abilities `a`.
inline std::int64_t rank_workspace_bytes(const Plan& plan, const MeshCoord& me,
                                         std::uint32_t point_to_point, LinkAbilities a = {}) {
  return plan.empty() ? 0 : place_blocks(plan, me, point_to_point, a).peak;
}

// workspace_bytes(plan) over a link with abilities `a`, with the steps whose bit is set in
// `point_to_point` run as messages (run_plan's argument of that name).
inline std::int64_t workspace_bytes(const Plan& plan, std::uint32_t point_to_point,
                                    LinkAbilities a = {}) {
  const DeviceMesh& mesh = plan.src().mesh();
  std::int64_t most = 0;
  for (int r = 0; r < mesh.size(); ++r)
    most = std::max(most, rank_workspace_bytes(plan, mesh.coordinate_at(r), point_to_point, a));
  return most;
}

// Whether run_plan over a link with abilities `a` holds on every rank at most the larger of that
// rank's source and target blocks (issue 5's bound).
inline bool scratch_within_ends(const Plan& plan, LinkAbilities a) {
  const DeviceMesh& mesh = plan.src().mesh();
  for (int r = 0; r < mesh.size(); ++r) {
    const int rank = mesh.rank_at(r);
    const std::int64_t ends = std::max(plan.src().local_bytes(rank), plan.dst().local_bytes(rank));
    if (rank_workspace_bytes(plan, mesh.coordinate_at(r), 0, a) > ends) return false;
  }
  return true;
}

// plan_redistribute for a link with abilities `a` (plan_redistribute_for): the plan asked for
// where it seeks no bound (Memory::any, or Memory::automatic below bounded_from_bytes) or holds
// it on the link; else, of the plans of both objectives under Memory::bounded and Memory::any
// (one of those where it holds the bound as Memory::automatic takes it, plan_builder::holds_bound),
// those that hold it on the link, under Memory::automatic those within its slack of the fastest
// (under Objective::bytes: no more bytes), the best by the objective asked for (time: the least
// estimated time, then the fewest bytes; bytes: the other way round), run as bounded; where none
// is, the same of the bounded plans of both objectives without all-to-alls (allow_all_to_all
// false, where it is not already); then the plans of one exchange straight to the target
// (for_each_one_exchange_plan, each of them, not only the fastest); then those after reductions
// of the source's first Partials (for_each_reducing_lead), the best of them within; else the plan
// asked for.
inline Plan plan_within_ends(const Layout& src, const Layout& dst, const PlanOptions& options,
                             LinkAbilities a) {
  Plan plan = plan_redistribute(src, dst, options);
  const bool automatic = options.memory == Memory::automatic;
  if (!(options.memory == Memory::bounded || (automatic && seeks_bound(src, dst, options))) ||
      scratch_within_ends(plan, a))
    return plan;
  const bool by_time = options.objective == Objective::time;
  auto before = [&](const Plan& x, const Plan& y) {
    if (by_time && x.est_us() != y.est_us()) return x.est_us() < y.est_us();
    if (x.bytes_recv_max() != y.bytes_recv_max()) return x.bytes_recv_max() < y.bytes_recv_max();
    return x.est_us() < y.est_us();
  };
  std::optional<Plan> fastest, best;  // fastest: Memory::any's of the objective asked for
  auto take = [&](Plan p) {
    if (automatic && (by_time ? p.est_us() > (1 + options.memory_slack) * fastest->est_us()
                              : p.bytes_recv_max() > fastest->bytes_recv_max()))
      return;
    plan_builder::set_memory(p, options.memory, true);
    if (scratch_within_ends(p, a) && (!best || before(p, *best))) best = p;
  };
  auto consider = [&](const PlanOptions& o) {
    Plan p = plan_redistribute(src, dst, o);
    if (o.memory == Memory::any && o.objective == options.objective) fastest = p;
    if (o.memory == Memory::any && !plan_builder::holds_bound(p)) return;
    take(std::move(p));
  };
  const Objective other = by_time ? Objective::bytes : Objective::time;
  for (const Memory memory : {Memory::any, Memory::bounded})
    for (const Objective objective : {options.objective, other}) {
      if (!automatic && memory == Memory::bounded && objective == options.objective) continue;
      PlanOptions o = options;
      o.objective = objective;
      o.memory = memory;
      consider(o);
    }
  // Where none is within: the bounded plans without all-to-alls, whose uneven pieces move as
  // exact messages with staging where an exchange may move them where they lie.
  for (const Objective objective : {options.objective, other}) {
    if (best || !options.allow_all_to_all) break;
    PlanOptions o = options;
    o.objective = objective;
    o.memory = Memory::bounded;
    o.allow_all_to_all = false;
    consider(o);
  }
  // Then one exchange straight to the target, which holds no block between steps; else that
  // exchange after the source's first Partials are reduced on their own mesh dims
  // (for_each_reducing_lead), which holds only the block they leave.
  PlanOptions o = options;
  o.memory = Memory::bounded;
  if (!best) for_each_one_exchange_plan(src, dst, o, {}, take);
  if (!best)
    for_each_reducing_lead(src, dst, [&](const Transitions& lead) {
      for_each_one_exchange_plan(src, dst, o, lead, take);
    });
  return best ? *best : plan;
}

}  // namespace detail

// Bytes of scratch memory execute() holds at most on any rank for this plan, on a backend that
// packs strided pieces (NCCL) or on one that moves them where they lie (MPI, the simulator),
// whichever holds more: the blocks between steps that do not fit in (or cannot use) the
// caller's target, around each step, plus that step's staging. (A backend that packs mostly
// holds more; where a bounded plan's step packs one piece per round it can hold less.) Not
// counted: the caller's source and target, and what a backend allocates inside its
// collectives.
inline std::int64_t workspace_bytes(const Plan& plan) {
  constexpr detail::LinkAbilities strided{.strided_all_to_all = true,
                                          .strided_all_gather = true,
                                          .strided_exchange = true,
                                          .fills_in_place = true};
  return std::max(detail::workspace_bytes(plan, 0, detail::packing_abilities),
                  detail::workspace_bytes(plan, 0, strided));
}

// The same on backend B (`workspace_bytes<MpiBackend>(plan)`), whose strided operations
// (StridedAllToAll, StridedAllGather) need less staging: exactly what execute() holds on B's
// busiest rank.
template <Backend B>
std::int64_t workspace_bytes(const Plan& plan) {
  return detail::workspace_bytes(plan, 0, detail::abilities_of<detail::Link<B>>);
}

// What execute() holds on global rank `rank` on backend B: the figure its ExecuteStats report.
template <Backend B>
std::int64_t workspace_bytes(const Plan& plan, int rank) {
  // coordinate() names a rank outside the mesh.
  return detail::rank_workspace_bytes(plan, plan.src().mesh().coordinate(rank), 0,
                                      detail::abilities_of<detail::Link<B>>);
}

// The two above on this backend, with its options rather than its type's defaults (on MPI,
// Options::reduce_by_messages_from_bytes): what execute(plan, backend, ...) holds on the
// busiest rank, and on global rank `rank`.
template <Backend B>
std::int64_t workspace_bytes(const Plan& plan, const B& backend) {
  return detail::workspace_bytes(plan, 0, detail::backend_abilities(backend));
}
template <Backend B>
std::int64_t workspace_bytes(const Plan& plan, const B& backend, int rank) {
  return detail::rank_workspace_bytes(plan, plan.src().mesh().coordinate(rank), 0,
                                      detail::backend_abilities(backend));
}

// Whether execute() on backend B holds, on every rank, at most the larger of that rank's source
// and target blocks (workspace_bytes<B>(plan, rank) against both).
template <Backend B>
bool scratch_within_ends(const Plan& plan) {
  return detail::scratch_within_ends(plan, detail::abilities_of<detail::Link<B>>);
}

// plan_redistribute(src, dst, options) for running on backend B. Where the planner seeks the
// memory bound (Memory::bounded; Memory::automatic from bounded_from_bytes) it bounds each block
// between steps, not the two a step holds at once nor its staging (which a backend that packs
// strided pieces, NCCL, needs more of): where its plan holds more than the larger of some rank's
// source and target blocks on B (scratch_within_ends), the fastest (under Objective::bytes: the
// fewest bytes) of the plans of either objective, bounded or any, that stays within on every
// rank (where none does, bounded without all-to-alls, then one exchange straight to the target,
// then that exchange after the source's first Partials are reduced on their own mesh dims),
// under Memory::automatic within its slack of the fastest plan; it runs as bounded, and its options
// say which objective (and whether all-to-alls). Where none does, and under Memory::any,
// plan_redistribute's plan.
template <Backend B>
Plan plan_redistribute_for(const Layout& src, const Layout& dst, const PlanOptions& options = {}) {
  return detail::plan_within_ends(src, dst, options, detail::abilities_of<detail::Link<B>>);
}

// The same for this backend, with its options rather than its type's defaults.
template <Backend B>
Plan plan_redistribute_for(const Layout& src, const Layout& dst, const B& backend,
                           const PlanOptions& options = {}) {
  return detail::plan_within_ends(src, dst, options, detail::backend_abilities(backend));
}

// What one execute() call used, for tests and tuning.
struct ExecuteStats {
  // The most scratch memory held at once: blocks between steps plus a step's staging.
  std::int64_t scratch_peak_bytes = 0;
};

// Whether execute() runs `plan` with its source and target in one buffer (src == dst): every
// step keeps the block and changes only values where they lie (all-reduces, scales), as an
// all-reduce of gradients in place does. Other plans need two buffers that do not overlap.
constexpr bool runs_in_place(const Plan& plan) {
  return std::all_of(plan.begin(), plan.end(), [](const Step& s) {
    return s.kind == StepKind::all_reduce || s.kind == StepKind::scale ||
           s.kind == StepKind::identity;
  });
}

namespace detail {

// How many bytes the ranges [a, a + a_bytes) and [b, b + b_bytes) have in common (0 when either
// is empty), by address.
inline std::size_t common_bytes(const void* a, std::size_t a_bytes, const void* b,
                                std::size_t b_bytes) {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a), b0 = reinterpret_cast<std::uintptr_t>(b);
  if (a_bytes == 0 || b_bytes == 0) return 0;
  const std::uintptr_t lo = std::max(a0, b0), hi = std::min(a0 + a_bytes, b0 + b_bytes);
  return hi > lo ? hi - lo : 0;
}

// Where the source of an all-gather in place lies, for the rank at `me` whose target is at
// `dst`: its own slab of the target (member j's at j times the piece), as MPI_IN_PLACE and NCCL
// lay it out, where `plan` is one even all-gather whose pieces stack as slabs of the target;
// null otherwise.
inline const void* gather_slot(const Plan& plan, const MeshCoord& me, const void* dst) {
  if (plan.size() != 1 || plan[0].kind != StepKind::all_gather) return nullptr;
  const StepContext c = step_context(plan, 0, me, false);
  const GatherWay w = gather_way(c, LinkAbilities{});
  if (!c.even || c.step.padded || !w.direct || !w.whole) return nullptr;
  return static_cast<const std::byte*>(dst) +
         static_cast<std::size_t>(me[c.step.mesh_dim]) * w.piece_bytes;
}

// The bytes of this rank's source and target blocks.
struct BlockBytes {
  std::size_t src = 0;
  std::size_t dst = 0;
};

// Checks the backend and the buffers against the plan (sizes, and that the blocks' bytes at
// `src` and `dst` do not overlap, unless they are one buffer for a plan that runs_in_place or
// the source is this rank's slab of an all-gather's target, gather_slot); this rank's
// coordinate, and its blocks' bytes in `*blocks` when given.
template <Backend B>
MeshCoord check_run(const Plan& plan, const B& backend, const void* src, std::size_t src_bytes,
                    const void* dst, std::size_t dst_bytes, BlockBytes* blocks = nullptr) {
  if (!(backend.mesh() == plan.src().mesh()))
    fail<why::backend_mesh_mismatch>(backend.mesh().shape(), plan.src().mesh().shape());
  const int rank = backend.rank();
  MeshCoord me = plan.src().mesh().coordinate(rank);
  const auto elem = static_cast<std::size_t>(plan.src().elem_bytes());
  const std::size_t need_src = bytes_of(plan.src().local_box(me), elem);
  const std::size_t need_dst = bytes_of(plan.dst().local_box(me), elem);
  if (blocks != nullptr) *blocks = {need_src, need_dst};
  if (src_bytes < need_src) fail<why::buffer_too_small>("source", src_bytes, rank, need_src);
  if (dst_bytes < need_dst) fail<why::buffer_too_small>("target", dst_bytes, rank, need_dst);
  if (const std::size_t common = common_bytes(src, need_src, dst, need_dst);
      common != 0 && !(src == dst && dtensor::runs_in_place(plan)) &&
      src != gather_slot(plan, me, dst))
    fail<why::buffers_overlap>(rank, common);
  if constexpr (requires { backend.supports(DType::f32, ReduceOp::sum); }) {
    for (std::size_t i = 0; i < plan.size(); ++i) {
      const Step& s = plan[i];
      if (s.kind != StepKind::reduce_scatter && s.kind != StepKind::all_reduce) continue;
      const ReduceOp op = s.before[s.mesh_dim].reduce_op();
      if (!backend.supports(plan.src().dtype(), op))
        fail<why::backend_cannot_reduce>(name(plan.src().dtype()), name(op), i + 1);
    }
  }
  return me;
}

// Runs `f`; if it throws, aborts the backend first: the other ranks may be past their checks.
template <Backend B, class F>
decltype(auto) aborting_on_error(B& backend, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    abort_after_error(backend, e.what());
    throw;
  }
}

template <Backend B>
MeshCoord checked_run(const Plan& plan, B& backend, const void* src, std::size_t src_bytes,
                      const void* dst, std::size_t dst_bytes) {
  return aborting_on_error(
      backend, [&] { return check_run(plan, backend, src, src_bytes, dst, dst_bytes); });
}

template <class T, Backend B>
void check_span_dtype(const Plan& plan, B& backend) {
  aborting_on_error(backend, [&] {
    if (dtype_of<T> != plan.src().dtype())
      fail<why::span_dtype_mismatch>(name(dtype_of<T>), name(plan.src().dtype()));
  });
}

}  // namespace detail

template <Backend B>
class Execution;

namespace detail {
struct ExecutionAccess;
}  // namespace detail

template <Backend B>
Execution<B> execute_async(const Plan& plan, B& backend, const void* src, std::size_t src_bytes,
                           void* dst, std::size_t dst_bytes);

// Runs `plan` on this rank (backend.rank()): reads its block of plan.src() from `src` and writes
// its block of plan.dst() to `dst` (row-major, contiguous, in the backend's memory space: host
// memory, or device memory for a device backend, whose work is then ordered on its stream).
// `src_bytes` and `dst_bytes` are the buffers' sizes, checked against the blocks. The source is
// never written; `src` and `dst` must not overlap (refused), except that a plan which only
// changes values where they lie (all-reduces and scales: `P -> R`) runs in place, src == dst,
// and an all-gather whose pieces are slabs of the target (`S(0) -> R`) runs in place with its
// source at this rank's slab, as MPI_IN_PLACE and NCCL lay an in-place all-gather out. Every
// rank of the mesh must call this with the same plan, in the same order as its other executions on
// this backend.
template <Backend B>
void execute(const Plan& plan, B& backend, const void* src, std::size_t src_bytes, void* dst,
             std::size_t dst_bytes, ExecuteStats* stats = nullptr) {
  const MeshCoord me = detail::checked_run(plan, backend, src, src_bytes, dst, dst_bytes);
  if constexpr (AsyncBackend<B>) {
    // Blocking operations only once every execution in flight has started all of its.
    if (!detail::all_started()) {
      Execution<B> e = execute_async(plan, backend, src, src_bytes, dst, dst_bytes);
      e.wait();
      if (stats != nullptr) stats->scratch_peak_bytes = e.scratch_peak_bytes();
      return;
    }
  }
  detail::Task<void> run =
      detail::run_plan(plan, detail::Link<B>{backend}, me, static_cast<const std::byte*>(src),
                       static_cast<std::byte*>(dst), stats ? &stats->scratch_peak_bytes : nullptr);
  run.handle().resume();  // blocking operations: it runs to the end without suspending
  detail::aborting_on_error(backend, [&] { run.result(); });
}

// Typed spans: the element type must be the plan's dtype.
template <Backend B, class T>
void execute(const Plan& plan, B& backend, std::span<const T> src, std::span<T> dst,
             ExecuteStats* stats = nullptr) {
  detail::check_span_dtype<T>(plan, backend);
  execute(plan, backend, src.data(), src.size_bytes(), dst.data(), dst.size_bytes(), stats);
}

// A plan running in the background on one rank, from execute_async: wait() for it (or test()
// until it says done) before touching its buffers. On a backend with asynchronous operations
// (MPI) its steps advance inside test() and wait() of any execution on that backend; on a
// stream-ordered backend (NCCL) it is enqueued and wait() waits for the stream to reach it;
// otherwise it has already run. Destroying a running execution waits for it, dropping its error.
template <Backend B>
class [[nodiscard]] Execution {
 public:
  Execution(Execution&& other) noexcept
      : state_(std::exchange(other.state_, State{})), scratch_peak_(other.scratch_peak_) {}
  Execution& operator=(Execution&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      state_ = std::exchange(other.state_, State{});
      scratch_peak_ = other.scratch_peak_;
    }
    return *this;
  }
  Execution(const Execution&) = delete;
  Execution& operator=(const Execution&) = delete;
  ~Execution() { finish_quietly(); }

  // Advances without blocking; whether the execution has finished (its error, if any, is
  // thrown by wait()).
  bool test() {
    if constexpr (AsyncBackend<B>)
      return !state_ || detail::poll(*state_);
    else if constexpr (StreamBackend<B>)
      return !state_.fence || state_.fence->ready();
    else
      return true;
  }

  // Waits until the execution has finished; throws its error. Returns at once the second time.
  void wait() {
    if constexpr (AsyncBackend<B>) {
      if (!state_) return;
      auto running = std::move(state_);
      detail::drive(*running);
      scratch_peak_ = running->scratch_peak;
      running->task.result();
    } else if constexpr (StreamBackend<B>) {
      if (state_.fence) std::exchange(state_.fence, std::nullopt)->wait();
    }
  }

  // The most scratch memory the run held at once (ExecuteStats); final once wait() returned.
  [[nodiscard]] std::int64_t scratch_peak_bytes() const noexcept {
    if constexpr (AsyncBackend<B>)
      return state_ ? state_->scratch_peak : scratch_peak_;
    else
      return scratch_peak_;
  }

 private:
  friend Execution execute_async<B>(const Plan&, B&, const void*, std::size_t, void*, std::size_t);
  friend struct detail::ExecutionAccess;
  struct Enqueued {
    std::optional<decltype(std::declval<B&>().record())> fence;
  };
  using State = std::conditional_t<AsyncBackend<B>, std::unique_ptr<detail::Running<B>>,
                                   std::conditional_t<StreamBackend<B>, Enqueued, std::monostate>>;

  Execution() = default;

  void finish_quietly() noexcept {
    try {
      wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): documented, wait() reports errors
    }
  }

  State state_{};
  std::int64_t scratch_peak_ = 0;
};

namespace detail {
// How other forms of execute_async (a batch's, execute_batch.hpp) make an Execution.
struct ExecutionAccess {
  template <Backend B>
  static Execution<B> make() {
    return Execution<B>();
  }
  template <Backend B>
  static auto& state(Execution<B>& e) {
    return e.state_;
  }
  template <Backend B>
  static std::int64_t& scratch_peak(Execution<B>& e) {
    return e.scratch_peak_;
  }
};
}  // namespace detail

// Starts `plan` on this rank and returns while it runs: the same arguments and checks as
// execute(), and the same order rule (every rank starts its executions on a backend in the same
// order), but `src` and `dst` must stay valid and untouched until the execution has finished.
// Several executions may be in flight on one backend and finish in any order; on MPI, a second
// MpiBackend on the same ranks gives a second, independent queue (like a second stream).
template <Backend B>
Execution<B> execute_async(const Plan& plan, B& backend, const void* src, std::size_t src_bytes,
                           void* dst, std::size_t dst_bytes) {
  const MeshCoord me = detail::checked_run(plan, backend, src, src_bytes, dst, dst_bytes);
  Execution<B> e;
  if constexpr (AsyncBackend<B>) {
    auto running = std::make_unique<detail::Running<B>>(backend, plan);
    running->task = detail::run_plan(*running->plan, detail::Link<B>{backend, running.get()}, me,
                                     static_cast<const std::byte*>(src),
                                     static_cast<std::byte*>(dst), &running->scratch_peak);
    ExecutionQueue& queue = backend.executions();
    queue.push(running.get());
    // Its local work up to its first operation, which starts now if its turn has come.
    running->task.handle().resume();
    if (running->done()) queue.remove(running.get());
    e.state_ = std::move(running);
  } else {
    ExecuteStats stats;
    execute(plan, backend, src, src_bytes, dst, dst_bytes, &stats);
    e.scratch_peak_ = stats.scratch_peak_bytes;
    if constexpr (StreamBackend<B>) e.state_.fence.emplace(backend.record());
  }
  return e;
}

// Typed spans: the element type must be the plan's dtype.
template <Backend B, class T>
Execution<B> execute_async(const Plan& plan, B& backend, std::span<const T> src, std::span<T> dst) {
  detail::check_span_dtype<T>(plan, backend);
  return execute_async(plan, backend, src.data(), src.size_bytes(), dst.data(), dst.size_bytes());
}

}  // namespace dtensor
