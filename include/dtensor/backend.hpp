#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "device_mesh.hpp"
#include "dtype.hpp"
#include "local_ops.hpp"
#include "reduce_op.hpp"

// What a backend provides to run plans: one per rank, SPMD. The executor (execute.hpp) calls
// these on every rank in the same order; a backend is one header that implements them over its
// communication library (backend/simulated.hpp, backend/mpi.hpp, backend/nccl.hpp).
namespace dtensor {

// Where a backend's buffers live.
enum class MemorySpace { host, device };

// One message of a grouped point-to-point round: `bytes` bytes to or from global rank `peer`.
struct SendMessage {
  int peer = 0;
  const void* data = nullptr;
  std::size_t bytes = 0;
};
struct RecvMessage {
  int peer = 0;
  void* data = nullptr;
  std::size_t bytes = 0;
};

// A backend for one rank of `mesh()`. Collectives act on the group of this rank along one
// mesh dim (mesh().group(rank(), mesh_dim)), members in group-index order; every member calls
// with the same sizes. Buffers hold `count` elements of `dtype` (or plain bytes for pure data
// movement), contiguous, in the backend's memory space.
//  - all_gather: recv holds the members' `bytes` each, in order. send may be this member's
//    place in recv, recv + index * bytes (in place: a batch packs its block there).
//  - reduce_scatter: send holds one block of `count` elements per member, in order; recv gets
//    this member's block reduced over the group (f16 and bf16 accumulate in float).
//  - all_reduce: recv gets the reduction of send over the group; every member gets bit-identical
//    values. send may be recv (in place; the executor runs an all-reduce in the caller's target
//    that way); other buffers never overlap.
//  - all_to_all: send holds one block of `bytes` per member, in order; recv gets member j's block
//    for this rank at position j.
//  - exchange: a grouped point-to-point round between global ranks; each send is matched by a
//    receive of the same size on its peer. Messages to self are allowed.
// Reductions combine the members' contributions in group-index order. A backend that cannot
// reduce every dtype with every op says which it can: `supports(dtype, op)`; execute() then
// refuses a plan that needs another before anything moves.
// A backend whose memory is not host memory also provides `local_ops()`, the LocalOps
// (local_ops.hpp) that execute() uses for its packing, filling and staging on that memory.
// A backend whose reductions are slow on large blocks may have the executor reduce them itself
// over point-to-point rounds: `static constexpr std::size_t reduce_messages_bytes` (from how many
// bytes of block, its type's default) and, optionally, `std::size_t reduce_by_messages_from()
// const` (the same for this instance, the same on every rank).
template <class B>
concept Backend = requires(B& b, const B& cb, int mesh_dim, const void* send, void* recv,
                           std::size_t n, DType dtype, ReduceOp op,
                           std::span<const SendMessage> sends, std::span<const RecvMessage> recvs) {
  { B::memory } -> std::convertible_to<MemorySpace>;
  { cb.rank() } -> std::convertible_to<int>;
  { cb.mesh() } -> std::convertible_to<const DeviceMesh&>;
  b.all_gather(mesh_dim, send, recv, n);
  b.reduce_scatter(mesh_dim, send, recv, n, dtype, op);
  b.all_reduce(mesh_dim, send, recv, n, dtype, op);
  b.all_to_all(mesh_dim, send, recv, n);
  b.exchange(sends, recvs);
}
&&(B::memory == MemorySpace::host || requires(B & b) {
  { b.local_ops() } -> LocalOps;
});

class ExecutionQueue;

namespace detail {
// One asynchronous execution as its backend's queue sees it (execute.hpp drives it).
struct InFlight {
  // It has started every operation of its plan (or failed): later executions may start theirs.
  bool started_all = false;
  // Whether an operation of it is in flight.
  [[nodiscard]] virtual bool in_flight() const noexcept = 0;
  // If its operation in flight has finished: finishes it, runs the execution on to its next
  // operation (starting it when its turn has come) or to its end, and returns true.
  virtual bool advance() = 0;

 protected:
  ~InFlight() = default;
};

// Every execution queue of this process: an execution waiting for its operation advances the
// others too, since their next operations may be what another rank's wait needs.
inline std::vector<ExecutionQueue*>& all_queues() {
  static std::vector<ExecutionQueue*> queues;
  return queues;
}
}  // namespace detail

// The executions started on one backend and not yet finished, oldest first. An asynchronous
// backend owns one for execute_async (execute.hpp), which starts their operations in queue order
// so that every rank starts them in the same order, however it waits for them. Queues, and the
// executions on them, belong to one thread.
class ExecutionQueue {
 public:
  ExecutionQueue() { detail::all_queues().push_back(this); }
  ExecutionQueue(const ExecutionQueue&) = delete;
  ExecutionQueue& operator=(const ExecutionQueue&) = delete;
  ~ExecutionQueue() {
    auto& queues = detail::all_queues();
    queues.erase(std::remove(queues.begin(), queues.end(), this), queues.end());
  }

  [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  // Whether every execution in flight has started all its operations.
  [[nodiscard]] bool all_started() const noexcept {
    return std::all_of(entries_.begin(), entries_.end(),
                       [](const detail::InFlight* e) { return e->started_all; });
  }
  [[nodiscard]] const std::vector<detail::InFlight*>& entries() const noexcept { return entries_; }
  void push(detail::InFlight* e) { entries_.push_back(e); }
  void remove(const detail::InFlight* e) noexcept {
    entries_.erase(std::remove(entries_.begin(), entries_.end(), e), entries_.end());
  }

 private:
  std::vector<detail::InFlight*> entries_;
};

namespace detail {
// Advances one execution whose operation has finished, of any backend of this thread; whether
// there was one. (A backend's blocking wait calls it too: an operation in flight may move only
// when polled, and another rank may be waiting for it.)
inline bool advance_any() {
  for (ExecutionQueue* queue : all_queues())
    for (InFlight* entry : queue->entries())
      if (entry->advance()) return true;  // advancing changes the queues: look again
  return false;
}
}  // namespace detail

// A backend that can start an operation and finish it later, for execute_async: `start_*` take
// the arguments of the blocking forms and return a Request in flight, whose buffers the caller
// leaves alone until `test(request)` has returned true (it polls without blocking, and finishes
// the operation when it has completed; an error throws dtensor::error). Every rank starts the
// same operations in the same order: the executor sees to it through `executions()`.
template <class B>
concept AsyncBackend = Backend<B> && std::movable<typename B::Request> &&
    std::default_initializable<typename B::Request> &&
    requires(B& b, typename B::Request& request, int mesh_dim, const void* send, void* recv,
             std::size_t n, DType dtype, ReduceOp op, std::span<const SendMessage> sends,
             std::span<const RecvMessage> recvs) {
  { b.start_all_gather(mesh_dim, send, recv, n) } -> std::same_as<typename B::Request>;
  {
    b.start_reduce_scatter(mesh_dim, send, recv, n, dtype, op)
    } -> std::same_as<typename B::Request>;
  { b.start_all_reduce(mesh_dim, send, recv, n, dtype, op) } -> std::same_as<typename B::Request>;
  { b.start_all_to_all(mesh_dim, send, recv, n) } -> std::same_as<typename B::Request>;
  { b.start_exchange(sends, recvs) } -> std::same_as<typename B::Request>;
  { b.test(request) } -> std::same_as<bool>;
  b.wait(request);
  { b.executions() } -> std::same_as<ExecutionQueue&>;
};

// A backend whose work is ordered on a stream (a device backend) can mark the point its
// stream has reached: `record()` returns a fence whose `ready()` says whether the work before
// it has finished and whose `wait()` waits for it. execute_async records one after enqueuing a
// plan, so that the execution's wait() waits for the device.
template <class B>
concept StreamBackend = Backend<B> && requires(B& b) {
  { b.record().ready() } -> std::same_as<bool>;
  b.record().wait();
};

// Where one member's pieces of an all-to-all lie in its send buffer when they are not packed:
// piece j (the one for member j) is `rows` runs of `run_bytes` bytes, run r starting at byte
// j * run_bytes + r * stride_bytes. The g pieces of a row-major block along one of its dims
// are this, with stride_bytes = g * run_bytes (pieces_along in detail/step_runners.hpp).
struct StridedPieces {
  std::size_t rows = 0;
  std::size_t run_bytes = 0;
  std::size_t stride_bytes = 0;
  // Bytes of one piece, as it arrives (contiguous) at its member.
  [[nodiscard]] constexpr std::size_t piece_bytes() const noexcept { return rows * run_bytes; }
};

// A backend that sends an all-to-all's pieces from where they lie and receives them where they
// go, without packing or unpacking them (optional: execute() packs and unpacks and calls
// all_to_all where a backend lacks it). `all_to_all_strided(mesh_dim, send, recv, sent,
// received)` is `all_to_all(mesh_dim, packed, staged, sent.piece_bytes())` where `packed` would
// hold `send`'s pieces laid out as `sent` says, made contiguous one after another, and `staged`
// piece j would then go to where `received` puts piece j in `recv`. Contiguous pieces one after
// another are StridedPieces{1, bytes, g * bytes}; every member's pieces have the same
// piece_bytes(). An AsyncBackend also starts it: `start_all_to_all_strided`, same arguments.
template <class B>
concept StridedAllToAll = Backend<B> &&
    requires(B& b, int mesh_dim, const void* send, void* recv, StridedPieces p) {
  b.all_to_all_strided(mesh_dim, send, recv, p, p);
} &&(!AsyncBackend<B> ||
     requires(B & b, int mesh_dim, const void* send, void* recv, StridedPieces p) {
       {
         b.start_all_to_all_strided(mesh_dim, send, recv, p, p)
         } -> std::same_as<typename B::Request>;
     });

// One tensor's share of a batched all-to-all (BatchedAllToAll): its g pieces in `send`, laid out
// as `sent` says, and where the g pieces it receives go in `recv`, as `received` says.
struct AllToAllPart {
  const void* send = nullptr;
  void* recv = nullptr;
  StridedPieces sent, received;
};

// A backend that runs one all-to-all over several tensors' buffers at once, without packing
// them into one (optional: a batch's all-to-all round packs every tensor's pieces into one
// buffer per side where a backend lacks it). `all_to_all_batched(mesh_dim, parts)` is
// all_to_all_strided(mesh_dim, parts[t].send, parts[t].recv, parts[t].sent, parts[t].received)
// for every t, as one collective: every member passes as many parts, and part t's pieces have
// the same piece_bytes() on every member. An AsyncBackend also starts it (for a batch's
// execute_async): `start_all_to_all_batched`, same arguments, the parts' buffers left alone until
// it has finished. A backend may declare `static constexpr std::size_t batched_all_to_all_bytes`:
// rounds of fewer packed bytes (all members) are packed as on a backend without it.
template <class B>
concept BatchedAllToAll = Backend<B> &&
    requires(B& b, int mesh_dim, std::span<const AllToAllPart> parts) {
  b.all_to_all_batched(mesh_dim, parts);
} &&(!AsyncBackend<B> || requires(B & b, int mesh_dim, std::span<const AllToAllPart> parts) {
  { b.start_all_to_all_batched(mesh_dim, parts) } -> std::same_as<typename B::Request>;
});

// A backend that receives an all-gather's pieces where they go, without unpacking them
// (optional: execute() gathers into staging and unpacks where a backend lacks it).
// `all_gather_strided(mesh_dim, send, recv, pieces)` is `all_gather(mesh_dim, send, packed,
// pieces.piece_bytes())` with member j's piece then copied from `packed` to where StridedPieces
// puts piece j in `recv`; `send` is contiguous. An AsyncBackend also starts it:
// `start_all_gather_strided`, same arguments.
template <class B>
concept StridedAllGather = Backend<B> &&
    requires(B& b, int mesh_dim, const void* send, void* recv, StridedPieces p) {
  b.all_gather_strided(mesh_dim, send, recv, p);
} &&(!AsyncBackend<B> ||
     requires(B & b, int mesh_dim, const void* send, void* recv, StridedPieces p) {
       { b.start_all_gather_strided(mesh_dim, send, recv, p) } -> std::same_as<typename B::Request>;
     });

// One tensor's share of a batched all-gather (BatchedAllGather): this member's piece, one run of
// `received.piece_bytes()` bytes at `send`, and where the g pieces go in `recv`, as `received`
// says (contiguous pieces one after another: StridedPieces{1, bytes, g * bytes}). `send` may be
// this member's own place in `recv` (in place).
struct AllGatherPart {
  const void* send = nullptr;
  void* recv = nullptr;
  StridedPieces received;
};

// A backend that runs one all-gather over several tensors' buffers at once, without packing
// them into one (optional: a batch's all-gather round packs every tensor's piece into one block
// and unpacks the gathered blocks where a backend lacks it). `all_gather_batched(mesh_dim,
// parts)` is all_gather_strided(mesh_dim, parts[t].send, parts[t].recv, parts[t].received) for
// every t, as one collective: every member passes as many parts, and part t's pieces have the
// same piece_bytes() on every member. An AsyncBackend also starts it:
// `start_all_gather_batched`, same arguments. A backend may declare `static constexpr
// std::size_t batched_all_gather_bytes`: rounds of fewer gathered bytes (all members) are packed
// as on a backend without it.
template <class B>
concept BatchedAllGather = Backend<B> &&
    requires(B& b, int mesh_dim, std::span<const AllGatherPart> parts) {
  b.all_gather_batched(mesh_dim, parts);
} &&(!AsyncBackend<B> || requires(B & b, int mesh_dim, std::span<const AllGatherPart> parts) {
  { b.start_all_gather_batched(mesh_dim, parts) } -> std::same_as<typename B::Request>;
});

namespace detail {
// Copies `bytes` bytes laid out as the runs of `from_runs` at `from` (run r at r * stride_bytes)
// into the runs of `to_runs` at `to`, both cut differently and walked together, calling
// `copy(to, from, n)` for each stretch: how backends move strided pieces in memory.
template <class Copy>
void copy_runs(Copy&& copy, const void* from, StridedPieces from_runs, void* to,
               StridedPieces to_runs, std::size_t bytes) {
  const auto* source = static_cast<const std::byte*>(from);
  auto* target = static_cast<std::byte*>(to);
  std::size_t from_row = 0, from_at = 0, to_row = 0, to_at = 0;
  for (std::size_t left = bytes; left > 0;) {
    const std::size_t n =
        std::min({from_runs.run_bytes - from_at, to_runs.run_bytes - to_at, left});
    copy(target + to_row * to_runs.stride_bytes + to_at,
         source + from_row * from_runs.stride_bytes + from_at, n);
    left -= n;
    if ((from_at += n) == from_runs.run_bytes) from_at = 0, ++from_row;
    if ((to_at += n) == to_runs.run_bytes) to_at = 0, ++to_row;
  }
}
}  // namespace detail

// A message of a strided point-to-point round (StridedExchange): `runs.rows` runs of
// `runs.run_bytes` bytes, run r at byte r * runs.stride_bytes of `data` (one contiguous run of
// n bytes is {1, n, n}). A send matches a receive of the same number of bytes, however either
// side lies.
struct StridedSendMessage {
  int peer = 0;
  const void* data = nullptr;
  StridedPieces runs;
};
struct StridedRecvMessage {
  int peer = 0;
  void* data = nullptr;
  StridedPieces runs;
};

namespace detail {
// The messages of a point-to-point round as strided ones, each one contiguous run: how a
// StridedExchange backend runs `exchange` through `exchange_strided`.
struct StridedRound {
  std::vector<StridedSendMessage> sends;
  std::vector<StridedRecvMessage> recvs;
};
inline StridedRound as_strided(std::span<const SendMessage> sends,
                               std::span<const RecvMessage> recvs) {
  StridedRound out;
  out.sends.reserve(sends.size());
  out.recvs.reserve(recvs.size());
  for (const SendMessage& m : sends) out.sends.push_back({m.peer, m.data, {1, m.bytes, m.bytes}});
  for (const RecvMessage& m : recvs) out.recvs.push_back({m.peer, m.data, {1, m.bytes, m.bytes}});
  return out;
}
}  // namespace detail

// A backend whose point-to-point round sends and receives strided messages where they lie
// (optional: execute() packs and unpacks them and calls exchange where a backend lacks it).
// `exchange_strided(sends, recvs)` is `exchange` of the same messages made contiguous. An
// AsyncBackend also starts it: `start_exchange_strided`, same arguments.
template <class B>
concept StridedExchange = Backend<B> &&
    requires(B& b, std::span<const StridedSendMessage> s, std::span<const StridedRecvMessage> r) {
  b.exchange_strided(s, r);
} &&(!AsyncBackend<B> ||
     requires(B & b, std::span<const StridedSendMessage> s, std::span<const StridedRecvMessage> r) {
       { b.start_exchange_strided(s, r) } -> std::same_as<typename B::Request>;
     });

namespace detail {
// After an error on this rank: a backend that can abort (`abort(why)`, or NCCL's `abort()`) does,
// so that the other ranks get an error instead of waiting for this one.
template <class B>
void abort_after_error(B& b, const char* why) noexcept {
  if constexpr (requires { b.abort(std::string_view()); })
    b.abort(why);
  else if constexpr (requires { b.abort(); })
    b.abort();
}
}  // namespace detail

// The local operations execute() uses with backend `b`: its own where it has them, HostOps
// otherwise (host memory).
template <Backend B>
decltype(auto) local_ops_of(B& b) {
  if constexpr (requires { b.local_ops(); })
    return b.local_ops();
  else
    return HostOps{};
}

}  // namespace dtensor
