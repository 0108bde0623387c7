#pragma once

#include <algorithm>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "batch_plan.hpp"
#include "detail/in_flight.hpp"
#include "detail/step_runners.hpp"
#include "detail/task.hpp"
#include "detail/why.hpp"
#include "errors.hpp"
#include "execute.hpp"

// Running a batched plan: every tensor's steps run as in execute(), and each round's
// collectives go to the backend as one call on buffers packed tensor after tensor.
namespace dtensor {

// One tensor's buffers in a batched execute(): as execute()'s arguments.
struct TensorBuffers {
  const void* src = nullptr;
  std::size_t src_bytes = 0;
  void* dst = nullptr;
  std::size_t dst_bytes = 0;
};

namespace detail {

// An operation one tensor's steps wait at until its round runs.
struct ParkedOp {
  enum class Kind { all_gather, reduce_scatter, all_reduce, all_to_all, exchange };
  Kind kind = Kind::exchange;
  int mesh_dim = -1;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t n = 0;  // bytes (all-gather: per member; all-to-all: per member) or elements
  DType dtype = DType::u8;
  ReduceOp op = ReduceOp::sum;
  std::span<const SendMessage> sends;
  std::span<const RecvMessage> recvs;
  // Where the pieces lie in send and go in recv (all-to-all, all-gather), when `strided`.
  StridedPieces sent, received;
  bool strided = false;
  std::coroutine_handle<> step;
  bool parked = false;
};

// The awaitable of a parked operation: records it and suspends the tensor's steps.
struct Parking {
  ParkedOp* slot = nullptr;
  ParkedOp op;
  [[nodiscard]] bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) const {
    *slot = op;
    slot->step = h;
    slot->parked = true;
  }
  void await_resume() const noexcept {}
};

// The link of one tensor of a batch: its operations park in `slot` for the batch's driver.
template <class B>
struct BatchLink {
  B& backend;
  ParkedOp* slot;

  [[nodiscard]] Parking all_gather(int k, const void* send, void* recv, std::size_t bytes) const {
    return park(ParkedOp::Kind::all_gather, k, send, recv, bytes);
  }
  [[nodiscard]] Parking reduce_scatter(int k, const void* send, void* recv, std::size_t count,
                                       DType dtype, ReduceOp op) const {
    return park(ParkedOp::Kind::reduce_scatter, k, send, recv, count, dtype, op);
  }
  [[nodiscard]] Parking all_reduce(int k, const void* send, void* recv, std::size_t count,
                                   DType dtype, ReduceOp op) const {
    return park(ParkedOp::Kind::all_reduce, k, send, recv, count, dtype, op);
  }
  [[nodiscard]] Parking all_to_all(int k, const void* send, void* recv, std::size_t bytes) const {
    return park(ParkedOp::Kind::all_to_all, k, send, recv, bytes);
  }
  // The round packs and unpacks the pieces where they lie: the tensor stages nothing.
  [[nodiscard]] Parking all_to_all_strided(int k, const void* send, void* recv, StridedPieces sent,
                                           StridedPieces received) const {
    Parking p = park(ParkedOp::Kind::all_to_all, k, send, recv, sent.piece_bytes());
    p.op.sent = sent;
    p.op.received = received;
    p.op.strided = true;
    return p;
  }
  [[nodiscard]] Parking all_gather_strided(int k, const void* send, void* recv,
                                           StridedPieces pieces) const {
    Parking p = park(ParkedOp::Kind::all_gather, k, send, recv, pieces.piece_bytes());
    p.op.sent = {1, pieces.piece_bytes(), pieces.piece_bytes()};
    p.op.received = pieces;
    p.op.strided = true;
    return p;
  }
  [[nodiscard]] Parking exchange(std::span<const SendMessage> sends,
                                 std::span<const RecvMessage> recvs) const {
    ParkedOp op;
    op.sends = sends;
    op.recvs = recvs;
    return {slot, op};
  }

 private:
  [[nodiscard]] Parking park(ParkedOp::Kind kind, int k, const void* send, void* recv,
                             std::size_t n, DType dtype = DType::u8,
                             ReduceOp op = ReduceOp::sum) const {
    ParkedOp p;
    p.kind = kind;
    p.mesh_dim = k;
    p.send = send;
    p.recv = recv;
    p.n = n;
    p.dtype = dtype;
    p.op = op;
    return {slot, p};
  }
};

// The packing buffers of a batched run, reused from round to round: each grows to the largest
// round's need.
template <class B>
struct PackingBuffers {
  using Buffer = std::remove_cvref_t<decltype(local_ops_of(std::declval<B&>()).allocate(0))>;
  Buffer send, recv;
  // `b`, grown to at least `bytes`.
  static std::byte* at_least(B& backend, Buffer& b, std::size_t bytes) {
    if (b.size() < bytes) b = local_ops_of(backend).allocate(bytes);
    return b.data();
  }
  [[nodiscard]] std::size_t size() const { return send.size() + recv.size(); }
};

// The steps of tensor t that run as point-to-point messages, one bit per step (run_plan's
// point_to_point).
template <std::size_t N>
std::uint32_t messages_of(const BatchPlan<N>& batch, std::size_t t) {
  std::uint32_t bits = 0;
  for (std::size_t i = 0; i < batch[t].size(); ++i)
    if (batch.point_to_point(t, i)) bits |= 1u << i;
  return bits;
}

// The packed size (bytes, all members) from which a batch's all-to-all round runs from the
// tensors' buffers on B (BatchedAllToAll), as B::batched_all_to_all_bytes says where B declares
// it (below it, packing is faster there), else at any size; never on a backend without it.
template <class B>
constexpr std::size_t batched_all_to_all_from() {
  if constexpr (!BatchedAllToAll<B>)
    return std::numeric_limits<std::size_t>::max();
  else if constexpr (requires { B::batched_all_to_all_bytes; })
    return B::batched_all_to_all_bytes;
  else
    return 0;
}

// The gathered size (bytes, all members) from which a batch's all-gather round runs from the
// tensors' buffers on B (BatchedAllGather), as B::batched_all_gather_bytes says where B declares
// it, else at any size; never on a backend without it.
template <class B>
constexpr std::size_t batched_all_gather_from() {
  if constexpr (!BatchedAllGather<B>)
    return std::numeric_limits<std::size_t>::max();
  else if constexpr (requires { B::batched_all_gather_bytes; })
    return B::batched_all_gather_bytes;
  else
    return 0;
}

// The same for one backend: its own thresholds where it has them (batched_all_to_all_from(),
// batched_all_gather_from(): options of the instance, the same on every rank), else its type's.
template <class B>
std::size_t batched_all_to_all_from(const B& backend) {
  if constexpr (BatchedAllToAll<B> && requires {
                  { backend.batched_all_to_all_from() } -> std::convertible_to<std::size_t>;
                })
    return backend.batched_all_to_all_from();
  else
    return batched_all_to_all_from<B>();
}
template <class B>
std::size_t batched_all_gather_from(const B& backend) {
  if constexpr (BatchedAllGather<B> && requires {
                  { backend.batched_all_gather_from() } -> std::convertible_to<std::size_t>;
                })
    return backend.batched_all_gather_from();
  else
    return batched_all_gather_from<B>();
}

// The bytes from which a batch's all-to-all and all-gather rounds run from the tensors' buffers,
// and whether an all-to-all round of several tensors that packs runs by peers instead: g - 1
// point-to-point rounds, in round s the pieces for member me+s packed and sent, those of member
// me-s received and unpacked, so that it holds two members' pieces, not the packed block twice.
struct RoundThresholds {
  std::size_t all_to_all = 0, all_gather = 0;
  bool all_to_all_by_peers = false;
};

// A batch's thresholds on a backend whose own are `all_to_all` and `all_gather`
// (batched_all_to_all_from, batched_all_gather_from): those, or for a batch whose plans are all
// bounded (Plan::memory_bounded) every size where the backend runs such rounds from the buffers at
// all (a packed all-to-all holds the packed block on both sides, twice the larger end; from the
// buffers it holds none), and by peers where it cannot (NCCL), whatever that costs in speed.
template <std::size_t N>
RoundThresholds round_thresholds(const BatchPlan<N>& batch, std::size_t all_to_all,
                                 std::size_t all_gather) {
  constexpr std::size_t never = std::numeric_limits<std::size_t>::max();
  bool bounded = !batch.empty();
  for (std::size_t t = 0; t < batch.size(); ++t) bounded = bounded && batch[t].memory_bounded();
  if (!bounded) return {all_to_all, all_gather};
  return {all_to_all == never ? never : 0, all_gather == never ? never : 0, all_to_all == never};
}

// A batch's all-reduce round of `count` elements in `packed`, in place, as two point-to-point
// rounds (reduces_round_by_messages): the packed block's g balanced slices reduce-scattered, the
// partials of this member's slice in the send packing buffer and reduced here in group order,
// then all-gathered. What execute()'s run_all_reduce_by_messages does for one tensor.
template <class B>
Task<void> all_reduce_by_messages(Link<B> link, int k, std::byte* packed, std::size_t count,
                                  std::size_t elem, DType dtype, ReduceOp op,
                                  PackingBuffers<B>& buffers) {
  B& backend = link.backend;
  const MeshGroup group = backend.mesh().group(backend.rank(), k);
  const int g = group.size;
  const auto n = static_cast<std::int64_t>(count);
  const auto own =
      static_cast<std::size_t>(chunk_range(n, g, group.index, ChunkPolicy::balanced).size);
  std::byte* staged = PackingBuffers<B>::at_least(backend, buffers.send,
                                                  static_cast<std::size_t>(g - 1) * own * elem);
  const SliceRounds r = all_reduce_slice_rounds(packed, packed, n, g, group.index, elem, staged,
                                                [&](int j) { return group.rank(j); });
  const ContiguousMessages scatter = contiguous(r.scatter), gather = contiguous(r.gather);
  co_await link.exchange(scatter.sends, scatter.recvs);
  if (r.own.size != 0)
    local_ops_of(backend).reduce(dtype, packed + static_cast<std::size_t>(r.own.start) * elem,
                                 r.parts, static_cast<std::size_t>(r.own.size), op);
  co_await link.exchange(gather.sends, gather.recvs);
}

// Whether a batch's all-reduce round by messages of `total` bytes per member on a group of `g`
// runs from the tensors' buffers (run_round) on a backend with both batched all-to-alls (from
// `all_to_all_from` bytes) and batched all-gathers (from `all_gather_from`): every tensor's
// block, of `counts` elements, cuts into g equal slices. The same on every member of the
// group, whose blocks are alike.
inline bool all_reduces_from_buffers(std::size_t total, std::size_t g, std::size_t all_to_all_from,
                                     std::size_t all_gather_from,
                                     const std::vector<std::size_t>& counts) {
  return g > 1 && total >= all_to_all_from && total >= all_gather_from &&
         std::all_of(counts.begin(), counts.end(), [g](std::size_t n) { return n % g == 0; });
}

// A packing all-to-all round of several tensors by peers (RoundThresholds::all_to_all_by_peers):
// this member's own pieces copied from each tensor's send side to its receive side, then in
// round s = 1 .. g-1 every tensor's piece for member me+s packed (at off[t], `total` bytes in
// all) and sent, and member me-s's received and unpacked. Packing buffers of `total` bytes each.
template <class B, class Piece>
Task<void> all_to_all_by_peers(Link<B> link, const std::vector<ParkedOp*>& ops,
                               PackingBuffers<B>& buffers, Piece piece,
                               const std::vector<std::size_t>& off, std::size_t total) {
  using Packing = PackingBuffers<B>;
  if (total == 0) co_return;
  B& backend = link.backend;
  const auto local = local_ops_of(backend);
  const MeshGroup group = backend.mesh().group(backend.rank(), ops.front()->mesh_dim);
  const auto g = static_cast<std::size_t>(group.size);
  const auto me = static_cast<std::size_t>(group.index);
  std::byte* send = Packing::at_least(backend, buffers.send, total);
  std::byte* recv = Packing::at_least(backend, buffers.recv, total);
  std::vector<RunCopy> copies;
  // Member j's pieces of every tensor packed from the send sides into `packed`, or (`unpack`)
  // from `packed` to the receive sides: strided runs where the op's pieces are, else one run.
  auto move_member = [&](std::size_t j, std::byte* packed, bool unpack) {
    copies.clear();
    for (std::size_t t = 0; t < ops.size(); ++t) {
      const ParkedOp& o = *ops[t];
      if (!piece(t)) continue;
      const StridedPieces whole{1, piece(t), piece(t)};
      const StridedPieces& p = !o.strided ? whole : unpack ? o.received : o.sent;
      const std::size_t at = j * p.run_bytes;
      if (unpack)
        copies.push_back({packed + off[t], static_cast<std::byte*>(o.recv) + at, p.rows,
                          p.run_bytes, p.run_bytes, p.stride_bytes});
      else
        copies.push_back({static_cast<const std::byte*>(o.send) + at, packed + off[t], p.rows,
                          p.run_bytes, p.stride_bytes, p.run_bytes});
    }
    copy_runs(local, std::span<const RunCopy>(copies));
  };
  // The own pieces, through the send buffer (their runs may differ between the two sides).
  move_member(me, send, false);
  move_member(me, send, true);
  for (std::size_t s = 1; s < g; ++s) {
    const std::size_t to = (me + s) % g, from = (me + g - s) % g;
    move_member(to, send, false);
    const SendMessage out{group.rank(static_cast<int>(to)), send, total};
    const RecvMessage in{group.rank(static_cast<int>(from)), recv, total};
    co_await link.exchange(std::span<const SendMessage>(&out, 1),
                           std::span<const RecvMessage>(&in, 1));
    move_member(from, recv, true);
  }
}

// Runs the parked operations `ops` of one round as one operation of `link`, packing in
// `buffers`; a reduce-scatter or all-reduce round as point-to-point rounds where
// `reduce_by_messages` (reduces_round_by_messages): an all-reduce's two, an
// all-to-all by peers g - 1 (batch_link_operations).
template <class B>
Task<void> run_round(Link<B> link, const std::vector<ParkedOp*>& ops, PackingBuffers<B>& buffers,
                     bool reduce_by_messages, RoundThresholds from) {
  B& backend = link.backend;
  const auto local = local_ops_of(backend);
  // From how many bytes the all-to-all and all-gather rounds run from the tensors' buffers.
  [[maybe_unused]] const std::size_t all_to_all_from = from.all_to_all;
  [[maybe_unused]] const std::size_t all_gather_from = from.all_gather;
  using Packing = PackingBuffers<B>;
  const ParkedOp& first = *ops.front();
  using Kind = ParkedOp::Kind;
  if (ops.size() == 1 && first.strided) {
    // One tensor's strided pieces: the backend moves them where they lie, if it can.
    const ParkedOp& o = first;
    if constexpr (StridedAllToAll<B>) {
      if (o.kind == Kind::all_to_all) {
        co_await link.all_to_all_strided(o.mesh_dim, o.send, o.recv, o.sent, o.received);
        co_return;
      }
    }
    if constexpr (StridedAllGather<B>) {
      if (o.kind == Kind::all_gather) {
        co_await link.all_gather_strided(o.mesh_dim, o.send, o.recv, o.received);
        co_return;
      }
    }
  } else if (ops.size() == 1 && !reduce_by_messages) {  // nothing to pack
    const ParkedOp& o = first;
    switch (o.kind) {
      case Kind::all_gather: co_await link.all_gather(o.mesh_dim, o.send, o.recv, o.n); break;
      case Kind::reduce_scatter:
        co_await link.reduce_scatter(o.mesh_dim, o.send, o.recv, o.n, o.dtype, o.op);
        break;
      case Kind::all_reduce:
        co_await link.all_reduce(o.mesh_dim, o.send, o.recv, o.n, o.dtype, o.op);
        break;
      case Kind::all_to_all: co_await link.all_to_all(o.mesh_dim, o.send, o.recv, o.n); break;
      case Kind::exchange: co_await link.exchange(o.sends, o.recvs); break;
    }
    co_return;
  }
  if (first.kind == Kind::exchange) {
    // One message per peer and direction: each tensor's messages to (from) that peer, in tensor
    // order and, within a tensor, in its own order; sender and receiver agree on both. A backend
    // that moves a large message in place more cheaply than packed (B::direct_message_bytes: MPI
    // copies it once, straight between the two ranks' buffers) sends the messages of at least
    // that size as they are, after the packed one and in the same order; both sides pick the
    // same ones, since each message has the same size on both.
    std::size_t direct = std::numeric_limits<std::size_t>::max();
    if constexpr (requires { B::direct_message_bytes; }) direct = B::direct_message_bytes;
    std::vector<int> to, from;
    std::vector<std::size_t> to_bytes, from_bytes;
    auto slot = [](std::vector<int>& peers, std::vector<std::size_t>& bytes, int peer) {
      const auto it = std::find(peers.begin(), peers.end(), peer);
      if (it != peers.end()) return static_cast<std::size_t>(it - peers.begin());
      peers.push_back(peer);
      bytes.push_back(0);
      return peers.size() - 1;
    };
    std::size_t direct_sends = 0, direct_recvs = 0;
    for (const ParkedOp* o : ops) {
      for (const SendMessage& m : o->sends) {
        if (m.bytes >= direct)
          ++direct_sends;
        else
          to_bytes[slot(to, to_bytes, m.peer)] += m.bytes;
      }
      for (const RecvMessage& m : o->recvs) {
        if (m.bytes >= direct)
          ++direct_recvs;
        else
          from_bytes[slot(from, from_bytes, m.peer)] += m.bytes;
      }
    }
    std::size_t send_total = 0, recv_total = 0;
    std::vector<std::size_t> to_at(to.size()), from_at(from.size());
    for (std::size_t i = 0; i < to.size(); ++i)
      to_at[i] = std::exchange(send_total, send_total + to_bytes[i]);
    for (std::size_t i = 0; i < from.size(); ++i)
      from_at[i] = std::exchange(recv_total, recv_total + from_bytes[i]);
    std::byte* packed = Packing::at_least(backend, buffers.send, send_total);
    std::byte* staged = Packing::at_least(backend, buffers.recv, recv_total);
    std::vector<SendMessage> sends;
    std::vector<RecvMessage> recvs;
    sends.reserve(to.size() + direct_sends);
    recvs.reserve(from.size() + direct_recvs);
    for (std::size_t i = 0; i < to.size(); ++i)
      if (to_bytes[i]) sends.push_back({to[i], packed + to_at[i], to_bytes[i]});
    for (std::size_t i = 0; i < from.size(); ++i)
      if (from_bytes[i]) recvs.push_back({from[i], staged + from_at[i], from_bytes[i]});
    std::vector<std::size_t> fill = to_at;
    std::vector<RunCopy> copies;  // issued together (copy_runs)
    for (const ParkedOp* o : ops)
      for (const SendMessage& m : o->sends) {
        if (m.bytes >= direct) {
          sends.push_back(m);
          continue;
        }
        const std::size_t i = slot(to, to_bytes, m.peer);
        if (m.bytes) copies.push_back({m.data, packed + fill[i], 1, m.bytes, m.bytes, m.bytes});
        fill[i] += m.bytes;
      }
    copy_runs(local, std::span<const RunCopy>(copies));
    for (const ParkedOp* o : ops)
      for (const RecvMessage& m : o->recvs)
        if (m.bytes >= direct) recvs.push_back(m);
    co_await link.exchange(sends, recvs);
    fill = from_at;
    copies.clear();
    for (const ParkedOp* o : ops)
      for (const RecvMessage& m : o->recvs) {
        if (m.bytes >= direct) continue;
        const std::size_t i = slot(from, from_bytes, m.peer);
        if (m.bytes) copies.push_back({staged + fill[i], m.data, 1, m.bytes, m.bytes, m.bytes});
        fill[i] += m.bytes;
      }
    copy_runs(local, std::span<const RunCopy>(copies));
    co_return;
  }
  const int k = first.mesh_dim;
  const auto g = static_cast<std::size_t>(backend.mesh().size(k));
  // Per member bytes of each tensor and their offsets in the packed member block.
  const std::size_t elem = first.kind == Kind::reduce_scatter || first.kind == Kind::all_reduce
                               ? size_of(first.dtype)
                               : 1;
  std::vector<std::size_t> off(ops.size());
  std::size_t total = 0;
  for (std::size_t t = 0; t < ops.size(); ++t)
    off[t] = std::exchange(total, total + ops[t]->n * elem);
  auto piece = [&](std::size_t t) { return ops[t]->n * elem; };
  // Tensor t's piece for group member j sits at j * piece(t) in its own buffer (or where its
  // StridedPieces put it) and at j * total + off[t] in the packed one; `members` pieces per
  // tensor (1 for a block).
  // One copy per tensor and member, all issued together (copy_runs).
  std::vector<RunCopy> copies;
  auto pack = [&](std::byte* packed, std::size_t members) {
    copies.clear();
    for (std::size_t j = 0; j < members; ++j)
      for (std::size_t t = 0; t < ops.size(); ++t) {
        const auto* from = static_cast<const std::byte*>(ops[t]->send);
        if (!piece(t)) continue;
        std::byte* to = packed + j * total + off[t];
        if (ops[t]->strided && members > 1) {
          const StridedPieces& p = ops[t]->sent;
          copies.push_back(
              {from + j * p.run_bytes, to, p.rows, p.run_bytes, p.stride_bytes, p.run_bytes});
        } else {
          copies.push_back({from + j * piece(t), to, 1, piece(t), piece(t), piece(t)});
        }
      }
    copy_runs(local, std::span<const RunCopy>(copies));
  };
  auto unpack = [&](const std::byte* packed, std::size_t members) {
    copies.clear();
    for (std::size_t j = 0; j < members; ++j)
      for (std::size_t t = 0; t < ops.size(); ++t) {
        auto* to = static_cast<std::byte*>(ops[t]->recv);
        if (!piece(t)) continue;
        const std::byte* from = packed + j * total + off[t];
        if (ops[t]->strided && members > 1) {
          const StridedPieces& p = ops[t]->received;
          copies.push_back(
              {from, to + j * p.run_bytes, p.rows, p.run_bytes, p.run_bytes, p.stride_bytes});
        } else {
          copies.push_back({from, to + j * piece(t), 1, piece(t), piece(t), piece(t)});
        }
      }
    copy_runs(local, std::span<const RunCopy>(copies));
  };
  switch (first.kind) {
    case Kind::all_gather: {
      if constexpr (BatchedAllGather<B>) {
        if (g * total >= all_gather_from) {  // from the tensors' buffers
          std::vector<AllGatherPart> parts;
          parts.reserve(ops.size());
          for (const ParkedOp* o : ops)
            parts.push_back(
                {o->send, o->recv, o->strided ? o->received : StridedPieces{1, o->n, g * o->n}});
          co_await link.all_gather_batched(k, parts);
          co_return;
        }
      }
      // In place: the packed block goes where this member's part of the result goes.
      std::byte* recv = Packing::at_least(backend, buffers.recv, g * total);
      std::byte* send =
          recv + static_cast<std::size_t>(backend.mesh().group(backend.rank(), k).index) * total;
      pack(send, 1);
      co_await link.all_gather(k, send, recv, total);
      unpack(recv, g);
      co_return;
    }
    case Kind::all_to_all: {
      if constexpr (BatchedAllToAll<B>) {
        if (g * total >= all_to_all_from) {  // from the tensors' buffers
          std::vector<AllToAllPart> parts;
          parts.reserve(ops.size());
          for (const ParkedOp* o : ops) {
            const StridedPieces contiguous{1, o->n, g * o->n};
            parts.push_back({o->send, o->recv, o->strided ? o->sent : contiguous,
                             o->strided ? o->received : contiguous});
          }
          co_await link.all_to_all_batched(k, parts);
          co_return;
        }
      }
      if (from.all_to_all_by_peers && ops.size() > 1) {
        co_await all_to_all_by_peers(link, ops, buffers, piece, off, total);
        co_return;
      }
      std::byte* send = Packing::at_least(backend, buffers.send, g * total);
      std::byte* recv = Packing::at_least(backend, buffers.recv, g * total);
      pack(send, g);
      co_await link.all_to_all(k, send, recv, total);
      unpack(recv, g);
      co_return;
    }
    case Kind::reduce_scatter: {
      if constexpr (BatchedAllToAll<B>) {
        if (reduce_by_messages && g * total >= all_to_all_from) {
          // The same round from the tensors' buffers: one batched all-to-all sends member j
          // piece j of every tensor where it lies and puts the g partials of this member's
          // piece of tensor t side by side at g * off[t] in the staging; each tensor's are then
          // reduced in group order straight into its target. Nothing packed or unpacked.
          // (In the send side's buffer, which the packed round fills with the same size.)
          std::byte* staged = Packing::at_least(backend, buffers.send, g * total);
          std::vector<AllToAllPart> parts;
          parts.reserve(ops.size());
          for (std::size_t t = 0; t < ops.size(); ++t) {
            const StridedPieces pieces{1, piece(t), g * piece(t)};
            parts.push_back({ops[t]->send, staged + g * off[t], pieces, pieces});
          }
          co_await link.all_to_all_batched(k, parts);
          std::vector<const void*> partials(g);
          for (std::size_t t = 0; t < ops.size(); ++t) {
            if (!piece(t)) continue;
            for (std::size_t j = 0; j < g; ++j) partials[j] = staged + g * off[t] + j * piece(t);
            local.reduce(first.dtype, ops[t]->recv, partials, ops[t]->n, first.op);
          }
          co_return;
        }
      }
      std::byte* send = Packing::at_least(backend, buffers.send, g * total);
      if (reduce_by_messages) {
        // One point-to-point round (B::reduce_messages_bytes): member j's slice of the
        // packed block to member j, the g partials of this member's slice reduced here in group
        // order, into the first other member's partial.
        const MeshGroup group = backend.mesh().group(backend.rank(), k);
        std::byte* recv = Packing::at_least(backend, buffers.recv, (g - 1) * total);
        pack(send, g);
        std::vector<SendMessage> sends;
        std::vector<RecvMessage> recvs;
        std::vector<const void*> parts(g);
        std::size_t next = 0;
        for (std::size_t j = 0; j < g; ++j) {
          const int peer = group.rank(static_cast<int>(j));
          if (static_cast<int>(j) == group.index) {
            parts[j] = send + j * total;
            continue;
          }
          sends.push_back({peer, send + j * total, total});
          recvs.push_back({peer, recv + next * total, total});
          parts[j] = recv + next++ * total;
        }
        co_await link.exchange(sends, recvs);
        local.reduce(first.dtype, recv, parts, total / elem, first.op);
        unpack(recv, 1);
        co_return;
      }
      std::byte* recv = Packing::at_least(backend, buffers.recv, total);
      pack(send, g);
      co_await link.reduce_scatter(k, send, recv, total / elem, first.dtype, first.op);
      unpack(recv, 1);
      co_return;
    }
    case Kind::all_reduce: {  // in place
      if constexpr (BatchedAllToAll<B> && BatchedAllGather<B>) {
        std::vector<std::size_t> counts(ops.size());
        for (std::size_t t = 0; t < ops.size(); ++t) counts[t] = ops[t]->n;
        if (reduce_by_messages &&
            all_reduces_from_buffers(total, g, all_to_all_from, all_gather_from, counts)) {
          // The two rounds from the tensors' buffers: each tensor's block cut in g equal
          // slices, member j's slice of every tensor sent to it by one batched all-to-all
          // (the g partials of this member's slice of tensor t side by side at off[t] in the
          // staging), reduced in group order straight into the tensor's target, then gathered
          // by one batched all-gather where the targets hold them. Nothing packed or unpacked.
          const auto me = static_cast<std::size_t>(backend.mesh().group(backend.rank(), k).index);
          std::byte* staged = Packing::at_least(backend, buffers.recv, total);
          std::vector<AllToAllPart> scatter;
          std::vector<AllGatherPart> gather;
          for (std::size_t t = 0; t < ops.size(); ++t) {
            const std::size_t slice = piece(t) / g;
            const StridedPieces slices{1, slice, g * slice};
            scatter.push_back({ops[t]->send, staged + off[t], slices, slices});
            gather.push_back(
                {static_cast<std::byte*>(ops[t]->recv) + me * slice, ops[t]->recv, slices});
          }
          co_await link.all_to_all_batched(k, scatter);
          std::vector<const void*> partials(g);
          for (std::size_t t = 0; t < ops.size(); ++t) {
            const std::size_t slice = piece(t) / g;
            if (slice == 0) continue;
            for (std::size_t j = 0; j < g; ++j) partials[j] = staged + off[t] + j * slice;
            local.reduce(first.dtype, static_cast<std::byte*>(ops[t]->recv) + me * slice, partials,
                         ops[t]->n / g, first.op);
          }
          co_await link.all_gather_batched(k, gather);
          co_return;
        }
      }
      std::byte* packed = Packing::at_least(backend, buffers.recv, total);
      pack(packed, 1);
      if (reduce_by_messages && g > 1) {
        co_await all_reduce_by_messages(link, k, packed, total / elem, elem, first.dtype, first.op,
                                        buffers);
      } else {
        co_await link.all_reduce(k, packed, packed, total / elem, first.dtype, first.op);
      }
      unpack(packed, 1);
      co_return;
    }
    case Kind::exchange: break;
  }
}

// A batch's link takes an all-to-all's and an all-gather's strided pieces (BatchLink): its
// round packs them from where they lie.
inline constexpr LinkAbilities batch_link_abilities{true, true, false, true};

// A batch's steps are one operation each, which its driver fuses into rounds: no bands.
template <class B>
inline constexpr LinkAbilities abilities_of<BatchLink<B>>{StridedLink<BatchLink<B>>,
                                                          StridedGatherLink<BatchLink<B>>,
                                                          StridedExchangeLink<BatchLink<B>>, true};

// Whether a step of round r of `batch` moves strided pieces on the rank at `me`.
template <std::size_t N>
bool round_is_strided(const BatchPlan<N>& batch, std::size_t r, const MeshCoord& me) {
  for (std::size_t t = 0; t < batch.size(); ++t)
    for (std::size_t s = 0; s < batch[t].size(); ++s) {
      if (batch.round_of(t, s) != static_cast<int>(r) || batch.point_to_point(t, s)) continue;
      const StepContext c = step_context(batch[t], s, me, false);
      if (c.step.kind == StepKind::all_gather && gather_way(c, batch_link_abilities).strided)
        return true;
      if (c.step.kind == StepKind::all_to_all) {
        const AllToAllWay w = all_to_all_way(c, batch_link_abilities);
        if (w.strided_send || w.strided_recv) return true;
      }
    }
  return false;
}

// What tensor t's step s adds to its collective round's packed block on the rank at `me`, as
// run_round packs it: its piece per member (all-gather, reduce-scatter, all-to-all), or its
// block (all-reduce).
inline std::size_t round_part_bytes(const Plan& p, std::size_t s, const MeshCoord& me) {
  const StepContext c = step_context(p, s, me, false);
  switch (p[s].kind) {
    case StepKind::all_gather: return gather_way(c, {}).piece_bytes;
    case StepKind::reduce_scatter: return scatter_way(c).piece_bytes;
    case StepKind::all_to_all: return all_to_all_way(c, {}).piece_bytes;
    default: return bytes_of(c.have, c.elem);
  }
}

// The bytes round r packs per group member on the rank at `me` (collective rounds).
template <std::size_t N>
std::size_t round_member_bytes(const BatchPlan<N>& batch, std::size_t r, const MeshCoord& me) {
  std::size_t total = 0;
  for (std::size_t t = 0; t < batch.size(); ++t)
    for (std::size_t s = 0; s < batch[t].size(); ++s)
      if (batch.round_of(t, s) == static_cast<int>(r)) total += round_part_bytes(batch[t], s, me);
  return total;
}

// The elements of each part of round r on the rank at `me`, in tensor order, as run_round sees
// the parked operations' counts.
template <std::size_t N>
std::vector<std::size_t> round_part_counts(const BatchPlan<N>& batch, std::size_t r,
                                           const MeshCoord& me) {
  std::vector<std::size_t> counts;
  for (std::size_t t = 0; t < batch.size(); ++t)
    for (std::size_t s = 0; s < batch[t].size(); ++s)
      if (batch.round_of(t, s) == static_cast<int>(r))
        counts.push_back(round_part_bytes(batch[t], s, me) /
                         static_cast<std::size_t>(batch[t].src().elem_bytes()));
  return counts;
}

// The first tensor with a step in round r, -1 if none.
template <std::size_t N>
int first_tensor_of_round(const BatchPlan<N>& batch, std::size_t r) {
  for (std::size_t t = 0; t < batch.size(); ++t)
    for (std::size_t s = 0; s < batch[t].size(); ++s)
      if (batch.round_of(t, s) == static_cast<int>(r)) return static_cast<int>(t);
  return -1;
}

// Whether round r, a reduce-scatter or an all-reduce, runs as point-to-point rounds on its
// packed block (one tensor's too) on a backend that asks for it from `from` packed bytes
// (reduce_messages_from: the backend's own threshold, or its type's): decided on the first
// rank's packed block, so that every rank of the mesh decides alike.
template <std::size_t N>
bool reduces_round_by_messages(const BatchPlan<N>& batch, std::size_t r, std::size_t from) {
  const BatchRound& round = batch.rounds()[r];
  const bool scatter = round.kind == StepKind::reduce_scatter;
  if (!scatter && round.kind != StepKind::all_reduce) return false;
  const DeviceMesh& mesh = batch[0].src().mesh();
  const auto g = static_cast<std::size_t>(mesh.size(round.mesh_dim));
  const std::size_t total = round_member_bytes(batch, r, mesh.coordinate(mesh.rank_at(0)));
  return g > 1 && (scatter ? g * total : total) >= from;
}

}  // namespace detail

namespace detail {

// workspace_bytes(batch) on a backend that runs an all-to-all round of at least
// `all_to_all_from` packed bytes, and an all-gather round of at least `all_gather_from` gathered
// bytes, from the tensors' buffers (batched_all_to_all_from, batched_all_gather_from; for a batch
// whose plans are bounded, round_thresholds), packing nothing for them.
template <std::size_t N>
std::int64_t batch_workspace_bytes(const BatchPlan<N>& batch, std::size_t all_to_all_from,
                                   std::size_t all_gather_from, std::size_t reduce_messages) {
  if (batch.empty()) return 0;
  const RoundThresholds from = round_thresholds(batch, all_to_all_from, all_gather_from);
  const std::size_t batched_all_to_all = from.all_to_all;
  const std::size_t batched_all_gather = from.all_gather;
  const DeviceMesh& mesh = batch[0].src().mesh();
  std::int64_t most = 0;
  for (int i = 0; i < mesh.size(); ++i) {
    const int rank = mesh.rank_at(i);
    const MeshCoord me = mesh.coordinate(rank);
    std::int64_t own = 0, send = 0, recv = 0;
    for (std::size_t t = 0; t < batch.size(); ++t)
      own = bytes_add(
          own, rank_workspace_bytes(batch[t], me, messages_of(batch, t), batch_link_abilities));
    for (std::size_t r = 0; r < batch.rounds().size(); ++r) {
      const BatchRound& round = batch.rounds()[r];
      // One tensor's round packs nothing, unless its pieces are strided (on a backend that
      // cannot move them so) or it reduces by messages.
      if (round.tensors < 2 && !round_is_strided(batch, r, me) &&
          !reduces_round_by_messages(batch, r, reduce_messages))
        continue;
      std::int64_t round_send = 0, round_recv = 0;
      if (round.kind == StepKind::exchange) {
        const RankBytes b = round_rank_bytes(batch, r, rank);
        round_send = b.send;
        round_recv = b.recv;
      } else {
        const std::size_t total = round_member_bytes(batch, r, me);
        const auto g = static_cast<std::size_t>(mesh.size(round.mesh_dim));
        switch (round.kind) {
          case StepKind::all_gather:
            if (g * total < batched_all_gather) round_recv = static_cast<std::int64_t>(g * total);
            break;
          case StepKind::all_reduce:
            round_recv = static_cast<std::int64_t>(total);
            // From the tensors' buffers, the staged partials of this member's slices take as
            // much as the packed block would; packed, the partials of its slice come beside it.
            if (reduces_round_by_messages(batch, r, reduce_messages) &&
                !all_reduces_from_buffers(total, g, batched_all_to_all, batched_all_gather,
                                          round_part_counts(batch, r, me))) {
              // The partials of this member's slice (all_reduce_by_messages).
              const auto t0 = static_cast<std::size_t>(first_tensor_of_round(batch, r));
              const auto e = static_cast<std::size_t>(batch[t0].src().elem_bytes());
              const Range own =
                  chunk_range(static_cast<std::int64_t>(total / e), static_cast<int>(g),
                              me[round.mesh_dim], ChunkPolicy::balanced);
              round_send =
                  static_cast<std::int64_t>((g - 1) * static_cast<std::size_t>(own.size) * e);
            }
            break;
          case StepKind::reduce_scatter:
            // The packed block, or by messages from the tensors' buffers the g partials of
            // this member's pieces, on the send side; received, this member's block, or by
            // messages from the packed block the partials of the others.
            round_send = static_cast<std::int64_t>(g * total);
            if (!reduces_round_by_messages(batch, r, reduce_messages))
              round_recv = static_cast<std::int64_t>(total);
            else if (g * total < batched_all_to_all)
              round_recv = static_cast<std::int64_t>((g - 1) * total);
            break;
          default:
            if (from.all_to_all_by_peers && round.tensors > 1)  // a member's pieces each side
              round_send = round_recv = static_cast<std::int64_t>(total);
            else if (g * total < batched_all_to_all)
              round_send = round_recv = static_cast<std::int64_t>(g * total);
            break;
        }
      }
      send = std::max(send, round_send);
      recv = std::max(recv, round_recv);
    }
    most = std::max(most, bytes_add(own, bytes_add(send, recv)));
  }
  return most;
}

}  // namespace detail

// Bytes of scratch memory execute() holds at most on any rank for this batch, on any backend:
// every tensor's own (as workspace_bytes of its plan; their steps interleave) plus the packing
// buffers, which grow to the largest round's need on each side. A collective round packs its
// block once (an all-gather and an all-reduce in place: the packed result only; a
// reduce-scatter or an all-to-all both sides; in a bounded batch an all-to-all of several
// tensors runs by peers, one member's pieces each side); a point-to-point round at most the bytes
// it sends and receives. Like ExecuteStats' peak of a batched run, it adds the tensors' own peaks.
template <std::size_t N>
std::int64_t workspace_bytes(const BatchPlan<N>& batch) {
  return detail::batch_workspace_bytes(batch, std::numeric_limits<std::size_t>::max(),
                                       std::numeric_limits<std::size_t>::max(),
                                       std::numeric_limits<std::size_t>::max());
}

// The same on backend B with its default options (`workspace_bytes<MpiBackend>(batch)`): on a
// BatchedAllToAll backend an all-to-all round packs nothing (on MPI, from 512 KiB of packed
// pieces up), nor does a reduce-scatter round by messages (on MPI, from 1 MiB packed), which
// stages the g partials of this member's pieces (g - 1 beside the packed block elsewhere); on
// a BatchedAllGather backend an all-gather round packs nothing (on MPI, from 512 KiB gathered;
// in a bounded batch both at any size),
// and on one with both an all-reduce round by messages whose blocks cut into g equal slices
// stages the partials of this member's slices only.
template <Backend B, std::size_t N>
std::int64_t workspace_bytes(const BatchPlan<N>& batch) {
  return detail::batch_workspace_bytes(batch, detail::batched_all_to_all_from<B>(),
                                       detail::batched_all_gather_from<B>(),
                                       detail::reduce_messages_of<detail::Link<B>>::bytes);
}

// The same on this backend, with its options (MpiBackend::Options::reduce_by_messages_from_bytes,
// batched_all_to_all_from_bytes, batched_all_gather_from_bytes).
template <Backend B, std::size_t N>
std::int64_t workspace_bytes(const BatchPlan<N>& batch, const B& backend) {
  return detail::batch_workspace_bytes(batch, detail::batched_all_to_all_from(backend),
                                       detail::batched_all_gather_from(backend),
                                       detail::reduce_messages_from(backend));
}

namespace detail {

// Whether some tensor's target buffer may meet another tensor's source or target buffer (of
// blocks[t]'s bytes): the targets sorted by address, each against the
// next, and against the sources merged into disjoint ranges that remember whether one tensor or
// several own them. O(n log n), where comparing every pair took most of a batched run's checks.
inline bool batch_buffers_may_meet(std::span<const TensorBuffers> buffers,
                                   std::span<const BlockBytes> blocks) {
  struct Range {
    std::uintptr_t begin, end;
    std::size_t owner;  // the tensor, or `several`
  };
  constexpr std::size_t several = std::numeric_limits<std::size_t>::max();
  std::vector<Range> dsts, srcs;
  for (std::size_t t = 0; t < buffers.size(); ++t) {
    const auto dst = reinterpret_cast<std::uintptr_t>(buffers[t].dst);
    const auto src = reinterpret_cast<std::uintptr_t>(buffers[t].src);
    if (blocks[t].dst != 0) dsts.push_back({dst, dst + blocks[t].dst, t});
    if (blocks[t].src != 0) srcs.push_back({src, src + blocks[t].src, t});
  }
  auto by_begin = [](const Range& a, const Range& b) { return a.begin < b.begin; };
  std::sort(dsts.begin(), dsts.end(), by_begin);
  for (std::size_t i = 0; i + 1 < dsts.size(); ++i)
    if (dsts[i].end > dsts[i + 1].begin) return true;
  std::sort(srcs.begin(), srcs.end(), by_begin);
  std::vector<Range> merged;
  for (const Range& r : srcs) {
    if (merged.empty() || r.begin >= merged.back().end) {
      merged.push_back(r);
      continue;
    }
    Range& m = merged.back();
    m.end = std::max(m.end, r.end);
    if (m.owner != r.owner) m.owner = several;
  }
  for (const Range& d : dsts) {
    // The first merged range that ends after d begins; their ends increase.
    auto it = std::upper_bound(merged.begin(), merged.end(), d.begin,
                               [](std::uintptr_t at, const Range& m) { return at < m.end; });
    for (; it != merged.end() && it->begin < d.end; ++it)
      if (it->owner != d.owner) return true;
  }
  return false;
}

// Refuses a batch whose target buffers overlap another tensor's source or target buffer (the
// blocks' bytes on this rank; sources may share memory, as they are only read).
// (`blocks`: each tensor's blocks' bytes on this rank, as check_run found them.)
inline void check_batch_buffers_apart(std::span<const TensorBuffers> buffers,
                                      std::span<const BlockBytes> blocks, int rank) {
  if (!batch_buffers_may_meet(buffers, blocks)) return;
  // Some do: every pair in order, so that the error names the first.
  for (std::size_t t = 0; t < buffers.size(); ++t)
    for (std::size_t u = 0; u < buffers.size(); ++u) {
      if (u == t) continue;
      const TensorBuffers& a = buffers[t];
      const TensorBuffers& b = buffers[u];
      if (const std::size_t c = common_bytes(a.dst, blocks[t].dst, b.src, blocks[u].src); c != 0)
        fail<why::batch_buffers_overlap>(t, "source", u, rank, c);
      if (const std::size_t c = common_bytes(a.dst, blocks[t].dst, b.dst, blocks[u].dst); c != 0)
        fail<why::batch_buffers_overlap>(t, "target", u, rank, c);
    }
}

}  // namespace detail

namespace detail {

// The operations a batch's run starts on its link (the Running's count): one per round, two for
// an all-reduce round by messages (reduces_round_by_messages: its slices scattered, then
// gathered), g - 1 for an all-to-all round by peers (RoundThresholds::all_to_all_by_peers;
// `all_to_all_from`: the backend's batched_all_to_all_from), as run_round issues them.
template <std::size_t N>
int batch_link_operations(const BatchPlan<N>& batch, std::size_t reduce_messages,
                          std::size_t all_to_all_from) {
  const bool by_peers = round_thresholds(batch, all_to_all_from, 0).all_to_all_by_peers;
  int n = 0;
  for (std::size_t r = 0; r < batch.rounds().size(); ++r) {
    const BatchRound& round = batch.rounds()[r];
    if (round.kind == StepKind::all_reduce && reduces_round_by_messages(batch, r, reduce_messages))
      n += 2;
    else if (round.kind == StepKind::all_to_all && by_peers && round.tensors > 1)
      n += batch[0].src().mesh().size(round.mesh_dim) - 1;
    else
      n += 1;
  }
  return n;
}

// The checks of a batched run on this rank, before anything moves: the buffers' count, each
// tensor's buffers (check_run) and their overlaps. Every tensor's coordinates on this rank.
template <Backend B, std::size_t N>
std::vector<MeshCoord> checked_batch(const BatchPlan<N>& batch, B& backend,
                                     std::span<const TensorBuffers> buffers) {
  std::vector<MeshCoord> me;
  aborting_on_error(backend, [&] {
    if (buffers.size() != batch.size()) fail<why::batch_buffer_count>(batch.size(), buffers.size());
    std::vector<BlockBytes> blocks(batch.size());
    for (std::size_t t = 0; t < batch.size(); ++t)
      me.push_back(check_run(batch[t], backend, buffers[t].src, buffers[t].src_bytes,
                             buffers[t].dst, buffers[t].dst_bytes, &blocks[t]));
    check_batch_buffers_apart(buffers, blocks, backend.rank());
  });
  return me;
}

// A batched run on this rank over `link` (blocking, or the asynchronous run it belongs to):
// every tensor's steps run as in execute() on a BatchLink, parking at each of its rounds; each
// round then runs as one operation of the link (run_round) and its tensors resume. Writes the
// scratch held at once, the tensors' peaks and the packing together, to `*scratch_peak` (when
// given). The frame holds its own copy of the buffers; the batch must outlive it.
template <class B, std::size_t N>
Task<void> run_batch(const BatchPlan<N>& batch, Link<B> link, std::vector<TensorBuffers> buffers,
                     std::vector<MeshCoord> me, std::int64_t* scratch_peak) {
  const std::size_t n = batch.size();
  const std::size_t reduce_messages = reduce_messages_from(link.backend);
  const RoundThresholds from =
      round_thresholds(batch, batched_all_to_all_from(std::as_const(link.backend)),
                       batched_all_gather_from(std::as_const(link.backend)));
  std::vector<ParkedOp> slots(n);
  std::vector<std::int64_t> peaks(n, 0);
  std::vector<Task<void>> tasks;
  tasks.reserve(n);
  PackingBuffers<B> packing;
  for (std::size_t t = 0; t < n; ++t) {
    tasks.push_back(run_plan(batch[t], BatchLink<B>{link.backend, &slots[t]}, me[t],
                             static_cast<const std::byte*>(buffers[t].src),
                             static_cast<std::byte*>(buffers[t].dst), &peaks[t],
                             messages_of(batch, t)));
    tasks.back().handle().resume();  // its local steps, up to its first round
    if (tasks.back().done()) tasks.back().result();
  }
  std::vector<std::size_t> next(n, 0);  // each tensor's next step
  std::vector<ParkedOp*> round;
  for (std::size_t r = 0; r < batch.rounds().size(); ++r) {
    round.clear();
    for (std::size_t t = 0; t < n; ++t) {
      const Plan& p = batch[t];
      while (next[t] < p.size() && batch.round_of(t, next[t]) < 0) ++next[t];
      if (next[t] == p.size() || batch.round_of(t, next[t]) != static_cast<int>(r)) continue;
      if (!slots[t].parked) fail<why::batch_internal>(t, r);
      round.push_back(&slots[t]);
      ++next[t];
    }
    if (round.empty()) fail<why::batch_internal>(n, r);
    co_await run_round(link, round, packing, reduces_round_by_messages(batch, r, reduce_messages),
                       from);
    for (ParkedOp* op : round) {
      op->parked = false;
      const auto t = static_cast<std::size_t>(op - slots.data());
      op->step.resume();  // its local steps, up to its next round or its end
      if (tasks[t].done()) tasks[t].result();
    }
  }
  for (std::size_t t = 0; t < n; ++t) {
    if (!tasks[t].done()) fail<why::batch_internal>(t, batch.rounds().size());
    tasks[t].result();
  }
  if (scratch_peak != nullptr) {
    auto held = static_cast<std::int64_t>(packing.size());
    for (std::int64_t p : peaks) held += p;
    *scratch_peak = held;
  }
}

}  // namespace detail

template <Backend B, std::size_t N>
Execution<B> execute_async(const BatchPlan<N>& batch, B& backend,
                           std::span<const TensorBuffers> buffers);

// Runs the batched plan on this rank (backend.rank()): buffers[t] holds tensor t's blocks, as
// execute() takes them for batch[t]. Each round is one backend call on packed buffers, so the
// batch pays one collective's latency per round instead of one per tensor and step. Every rank
// of the mesh runs the same batch in the same order as its other executions on this backend;
// with executions in flight that have not started all their operations, it runs as
// execute_async(...).wait(). `stats` (when given) gets the scratch held at once by all the
// tensors' steps and the packing of the largest round together, an upper bound of the peak.
template <Backend B, std::size_t N>
void execute(const BatchPlan<N>& batch, B& backend, std::span<const TensorBuffers> buffers,
             ExecuteStats* stats = nullptr) {
  if constexpr (AsyncBackend<B>) {
    if (!detail::all_started()) {
      Execution<B> e = execute_async(batch, backend, buffers);
      e.wait();
      if (stats != nullptr) stats->scratch_peak_bytes = e.scratch_peak_bytes();
      return;
    }
  }
  std::vector<MeshCoord> me = detail::checked_batch(batch, backend, buffers);
  detail::Task<void> run = detail::run_batch(
      batch, detail::Link<B>{backend}, std::vector<TensorBuffers>(buffers.begin(), buffers.end()),
      std::move(me), stats != nullptr ? &stats->scratch_peak_bytes : nullptr);
  run.handle().resume();  // blocking operations: it runs to the end without suspending
  detail::aborting_on_error(backend, [&] { run.result(); });
}

// Starts the batched plan on this rank and returns while it runs: the same arguments, checks and
// order rule as execute(batch, ...), as execute_async(plan, ...) is to execute(plan, ...). The
// batch and every tensor's buffers must stay valid, and the buffers untouched, until the
// execution has finished (a temporary batch is refused at compile time). On MPI its rounds are
// nonblocking collectives started in turn with the other executions on the backend, so that a
// layer's parameters gather while the caller computes; on NCCL it is enqueued on the stream;
// otherwise it has run when this returns.
template <Backend B, std::size_t N>
Execution<B> execute_async(const BatchPlan<N>& batch, B& backend,
                           std::span<const TensorBuffers> buffers) {
  std::vector<MeshCoord> me = detail::checked_batch(batch, backend, buffers);
  Execution<B> e = detail::ExecutionAccess::make<B>();
  if constexpr (AsyncBackend<B>) {
    auto running = std::make_unique<detail::Running<B>>(
        backend,
        detail::batch_link_operations(batch, detail::reduce_messages_from(std::as_const(backend)),
                                      detail::batched_all_to_all_from(std::as_const(backend))));
    running->task = detail::run_batch(batch, detail::Link<B>{backend, running.get()},
                                      std::vector<TensorBuffers>(buffers.begin(), buffers.end()),
                                      std::move(me), &running->scratch_peak);
    ExecutionQueue& queue = backend.executions();
    queue.push(running.get());
    // Its local work up to its first round, which starts now if its turn has come.
    running->task.handle().resume();
    if (running->done()) queue.remove(running.get());
    detail::ExecutionAccess::state(e) = std::move(running);
  } else {
    ExecuteStats stats;
    execute(batch, backend, buffers, &stats);
    detail::ExecutionAccess::scratch_peak(e) = stats.scratch_peak_bytes;
    if constexpr (StreamBackend<B>)
      detail::ExecutionAccess::state(e).fence.emplace(backend.record());
  }
  return e;
}

// A temporary batch would be gone before the execution finishes.
template <Backend B, std::size_t N>
Execution<B> execute_async(const BatchPlan<N>&& batch, B& backend,
                           std::span<const TensorBuffers> buffers) = delete;

}  // namespace dtensor
