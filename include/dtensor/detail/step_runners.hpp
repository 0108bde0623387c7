#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "../backend.hpp"
#include "../plan.hpp"
#include "../planner.hpp"
#include "link.hpp"
#include "task.hpp"

// The steps of a plan on one rank's buffers, written once for every backend: each is a
// coroutine that packs, `co_await`s its collective through a Link (blocking, or started and
// finished later for execute_async) and unpacks.
namespace dtensor::detail {

// How a collective step moves uneven pieces on this group: a native collective on pieces of one
// size (even, or padded), or exact sizes in one point-to-point round.
enum class Movement { native, exact };

struct StepContext {
  const Plan& plan;
  const Step& step;
  Layout before, after;
  MeshCoord me;
  Box have, want;
  std::size_t elem = 0;
  // Every group of the step cuts its pieces equally: one native collective everywhere. The
  // choice must be the same on every rank, since an exact step is a mesh-wide round.
  bool even = false;
};

inline std::size_t bytes_of(const Box& b, std::size_t elem) {
  return static_cast<std::size_t>(b.numel()) * elem;
}

inline Shape relative(const Box& inner, const Box& outer) {
  Shape s = inner.offset;
  for (std::size_t d = 0; d < s.size(); ++d) s[d] -= outer.offset[d];
  return s;
}

// Whether the pieces of `shape` along dim d are contiguous slabs of a row-major buffer (every
// dim before d has extent 1), so that a gather or scatter along d needs no block transpose.
inline bool slabs_along(const Shape& shape, int d) {
  for (int i = 0; i < d; ++i)
    if (shape[i] != 1) return false;
  return true;
}

// Where `piece`, a slab of the row-major block `block` (slabs_along), starts in it, in bytes.
inline std::size_t slab_offset(const Box& piece, const Box& block, std::size_t elem) {
  std::size_t at = 0;
  for (std::size_t d = 0; d < block.shape.size(); ++d)
    at = at * static_cast<std::size_t>(block.shape[d]) +
         static_cast<std::size_t>(piece.offset[d] - block.offset[d]);
  return at * elem;
}

// The g equal pieces of a row-major block of `shape` along dim d where they lie (pack_pieces
// would make them contiguous): one run of the piece per index of the dims before d.
inline StridedPieces pieces_along(const Shape& shape, int d, int g, std::size_t elem) {
  std::size_t rows = 1, inner = elem;
  for (int i = 0; i < d; ++i) rows *= static_cast<std::size_t>(shape[i]);
  for (std::size_t i = static_cast<std::size_t>(d) + 1; i < shape.size(); ++i)
    inner *= static_cast<std::size_t>(shape[i]);
  const std::size_t run = static_cast<std::size_t>(shape[d] / g) * inner;
  return {rows, run, run * static_cast<std::size_t>(g)};
}

// The block of member j of this rank's group along the step's mesh dim, under `l`.
inline Box member_box(const StepContext& c, const Layout& l, int j) {
  MeshCoord m = c.me;
  m[c.step.mesh_dim] = j;
  return l.local_box(m);
}

inline int global_rank(const StepContext& c, int j) {
  MeshCoord m = c.me;
  m[c.step.mesh_dim] = j;
  return c.plan.src().mesh().rank(m);
}

// Where each member's piece sits in a buffer that packs the pieces of the other members one
// after another: offsets[j] for member j (this member's piece takes no room), offsets[g] the
// total. `piece(j)` is member j's box.
template <class F>
std::vector<std::size_t> packed_offsets(const StepContext& c, F&& piece) {
  const int g = c.plan.src().mesh().size(c.step.mesh_dim), me = c.me[c.step.mesh_dim];
  std::vector<std::size_t> at(static_cast<std::size_t>(g) + 1, 0);
  for (int j = 0; j < g; ++j) {
    const auto u = static_cast<std::size_t>(j);
    at[u + 1] = at[u] + (j == me ? 0 : bytes_of(piece(j), c.elem));
  }
  return at;
}

// Copies `piece` (a block of the tensor inside both `from_box` and `to_box`) between buffers.
template <class Ops>
void copy_piece(const Ops& ops, const std::byte* from, const Box& from_box, std::byte* to,
                const Box& to_box, const Box& piece, std::size_t elem) {
  ops.copy_box(from, from_box.shape, relative(piece, from_box), to, to_box.shape,
               relative(piece, to_box), piece.shape, elem);
}

// The padded piece shape: `box` with each listed dim widened to the group's largest piece.
inline Shape padded_shape(const StepContext& c, Shape shape, int dim, std::int64_t range) {
  shape[dim] =
      chunk_range(range, c.plan.src().mesh().size(c.step.mesh_dim), 0, c.plan.src().policy()).size;
  return shape;
}

// Each run_* performs one step on `ops`'s memory and returns the bytes of staging it allocated.
// `c` and `ops` live in the caller's frame, which outlives the step.
template <class L, class Ops>
Task<std::size_t> run_all_gather(L link, const Ops& ops, const StepContext& c, const std::byte* cur,
                                 std::byte* out) {
  const int k = c.step.mesh_dim, i = c.step.before[k].dim();
  const int g = c.plan.src().mesh().size(k), me = c.me[k];
  const bool even = c.even;
  const Shape origin(c.have.shape.size(), 0);
  if (even || c.step.padded) {
    const Shape piece = padded_shape(c, c.have.shape, i, c.want.shape[i]);
    const std::size_t piece_bytes = bytes_of(Box{origin, piece}, c.elem);
    const bool exact = piece == c.have.shape;
    // Zero-copy: send the block as it is when it is a whole piece; receive straight into the
    // target when every member's piece is whole (even) and they stack as slabs of it, or, on a
    // backend that receives strided pieces (StridedAllGather), lie side by side in it.
    const bool direct = even && slabs_along(c.want.shape, i);
    const bool strided_recv = StridedGatherLink<L> && even && !direct;
    auto send = ops.allocate(exact ? 0 : piece_bytes, true);
    auto recv =
        ops.allocate(direct || strided_recv ? 0 : piece_bytes * static_cast<std::size_t>(g));
    if (!exact)
      ops.copy_box(cur, c.have.shape, origin, send.data(), piece, origin, c.have.shape, c.elem);
    const std::byte* const from = exact ? cur : send.data();
    if constexpr (StridedGatherLink<L>) {
      if (strided_recv)
        co_await link.all_gather_strided(k, from, out, pieces_along(c.want.shape, i, g, c.elem));
    }
    if (!strided_recv) co_await link.all_gather(k, from, direct ? out : recv.data(), piece_bytes);
    if (even && !direct && !strided_recv)
      ops.unpack_pieces(recv.data(), out, c.want.shape, i, g, c.elem);
    for (int j = 0; j < g && !even; ++j) {
      const Box bj = member_box(c, c.before, j);
      ops.copy_box(recv.data() + static_cast<std::size_t>(j) * piece_bytes, piece, origin, out,
                   c.want.shape, relative(bj, c.want), bj.shape, c.elem);
    }
    co_return send.size() + recv.size();
  }
  // Exact: every member's block, whatever its size, in one point-to-point round; straight into
  // the target where the blocks are slabs of it (and it is not the source too).
  const bool direct = slabs_along(c.want.shape, i) && cur != out;
  const std::vector<std::size_t> at =
      packed_offsets(c, [&](int j) { return member_box(c, c.before, j); });
  auto staging = ops.allocate(direct ? 0 : at.back());
  std::vector<SendMessage> sends;
  std::vector<RecvMessage> recvs;
  for (int j = 0; j < g; ++j) {
    if (j == me) continue;
    const auto u = static_cast<std::size_t>(j);
    if (!c.have.empty()) sends.push_back({global_rank(c, j), cur, bytes_of(c.have, c.elem)});
    if (at[u + 1] == at[u]) continue;
    std::byte* to = direct ? out + slab_offset(member_box(c, c.before, j), c.want, c.elem)
                           : staging.data() + at[u];
    recvs.push_back({global_rank(c, j), to, at[u + 1] - at[u]});
  }
  co_await link.exchange(sends, recvs);
  for (int j = 0; j < g; ++j) {
    if (direct && j != me) continue;
    const Box bj = member_box(c, c.before, j);
    const std::byte* from = j == me ? cur : staging.data() + at[static_cast<std::size_t>(j)];
    copy_piece(ops, from, bj, out, c.want, bj, c.elem);
  }
  co_return staging.size();
}

// A reduction as one point-to-point round: each member sends every other member its partial of
// that member's piece (`piece(j)`, inside the block), then reduces the g partials of its own
// piece (c.want) in group order, so that members with the same piece compute bit-identical
// values. Where `slabs`, the pieces are slabs of the block: they are sent as they lie, and this
// member's own partial is reduced from the block (unless the target is the block too).
template <class L, class Ops, class Piece>
Task<std::size_t> run_exchange_reduce(L link, const Ops& ops, const StepContext& c,
                                      const std::byte* cur, std::byte* out, bool slabs,
                                      Piece piece_of) {
  const int k = c.step.mesh_dim;
  const int g = c.plan.src().mesh().size(k), me = c.me[k];
  const std::size_t own_bytes = bytes_of(c.want, c.elem);
  const bool own_in_place = slabs && cur != out;
  const std::vector<std::size_t> at = packed_offsets(c, piece_of);
  auto packed = ops.allocate(slabs ? 0 : at.back());
  auto partials = ops.allocate(own_bytes * static_cast<std::size_t>(own_in_place ? g - 1 : g));
  std::vector<SendMessage> sends;
  std::vector<RecvMessage> recvs;
  std::vector<const void*> parts(static_cast<std::size_t>(g));
  std::size_t next = 0;
  for (int j = 0; j < g; ++j) {
    const auto u = static_cast<std::size_t>(j);
    if (j == me && own_in_place) {
      parts[u] = cur + slab_offset(c.want, c.have, c.elem);
      continue;
    }
    std::byte* partial = partials.data() + next++ * own_bytes;
    parts[u] = partial;
    if (j == me) {
      copy_piece(ops, cur, c.have, partial, c.want, c.want, c.elem);
      continue;
    }
    const Box aj = piece_of(j);
    const std::byte* piece = cur + (slabs ? slab_offset(aj, c.have, c.elem) : 0);
    if (!slabs) {
      piece = packed.data() + at[u];
      copy_piece(ops, cur, c.have, packed.data() + at[u], aj, aj, c.elem);
    }
    if (!aj.empty()) sends.push_back({global_rank(c, j), piece, at[u + 1] - at[u]});
    if (own_bytes) recvs.push_back({global_rank(c, j), partial, own_bytes});
  }
  co_await link.exchange(sends, recvs);
  ops.reduce(c.plan.src().dtype(), out, parts, static_cast<std::size_t>(c.want.numel()),
             c.step.before[k].reduce_op());
  co_return packed.size() + partials.size();
}

template <class L, class Ops>
Task<std::size_t> run_reduce_scatter(L link, const Ops& ops, const StepContext& c,
                                     const std::byte* cur, std::byte* out) {
  const int k = c.step.mesh_dim, j_dim = c.step.after[k].dim();
  const int g = c.plan.src().mesh().size(k);
  const ReduceOp op = c.step.before[k].reduce_op();
  const DType dtype = c.plan.src().dtype();
  const bool even = c.even;
  const Shape origin(c.want.shape.size(), 0);
  if (even || c.step.padded) {
    const Shape piece = padded_shape(c, c.want.shape, j_dim, c.have.shape[j_dim]);
    const Box piece_box{origin, piece};
    const std::size_t piece_bytes = bytes_of(piece_box, c.elem);
    const bool exact = piece == c.want.shape;
    // Zero-copy: send the block itself when the group is even and its pieces are slabs of it;
    // receive into the target when this member's piece needs no padding.
    const bool direct_send = even && slabs_along(c.have.shape, j_dim);
    auto send = ops.allocate(direct_send ? 0 : piece_bytes * static_cast<std::size_t>(g), !exact);
    auto recv = ops.allocate(exact ? 0 : piece_bytes);
    if (even && !direct_send) ops.pack_pieces(cur, c.have.shape, j_dim, g, send.data(), c.elem);
    for (int j = 0; j < g && !even; ++j) {
      const Box aj = member_box(c, c.after, j);
      ops.copy_box(cur, c.have.shape, relative(aj, c.have),
                   send.data() + static_cast<std::size_t>(j) * piece_bytes, piece, origin, aj.shape,
                   c.elem);
    }
    co_await link.reduce_scatter(k, direct_send ? cur : send.data(), exact ? out : recv.data(),
                                 static_cast<std::size_t>(piece_box.numel()), dtype, op);
    if (!exact)
      ops.copy_box(recv.data(), piece, origin, out, c.want.shape, origin, c.want.shape, c.elem);
    co_return send.size() + recv.size();
  }
  // Exact: one point-to-point round (run_exchange_reduce).
  co_return co_await run_exchange_reduce(link, ops, c, cur, out, slabs_along(c.have.shape, j_dim),
                                         [&c](int j) { return member_box(c, c.after, j); });
}

template <class L, class Ops>
Task<std::size_t> run_all_to_all(L link, const Ops& ops, const StepContext& c, const std::byte* cur,
                                 std::byte* out) {
  const int k = c.step.mesh_dim;
  const int i = c.step.before[k].dim(), j_dim = c.step.after[k].dim();
  const int g = c.plan.src().mesh().size(k), me = c.me[k];
  const bool even = c.even;
  const Shape origin(c.have.shape.size(), 0);
  if (even || c.step.padded) {
    Shape piece = c.have.shape;
    piece = padded_shape(c, piece, i, c.want.shape[i]);
    piece = padded_shape(c, piece, j_dim, c.have.shape[j_dim]);
    const std::size_t piece_bytes = bytes_of(Box{origin, piece}, c.elem);
    // Zero-copy where the pieces are slabs: of the block along j (send), of the target along i
    // (receive). Where they are not, a backend that moves strided pieces (StridedAllToAll)
    // takes them from the block as they lie and puts them in the target where they go;
    // otherwise they are packed and unpacked.
    const bool direct_send = even && slabs_along(c.have.shape, j_dim);
    const bool strided_send = StridedLink<L> && even && !direct_send;
    const bool direct_recv = even && slabs_along(c.want.shape, i);
    const bool strided_recv = StridedLink<L> && even && !direct_recv;
    auto send = ops.allocate(
        direct_send || strided_send ? 0 : piece_bytes * static_cast<std::size_t>(g), !even);
    auto recv =
        ops.allocate(direct_recv || strided_recv ? 0 : piece_bytes * static_cast<std::size_t>(g));
    if (even && !direct_send && !strided_send)
      ops.pack_pieces(cur, c.have.shape, j_dim, g, send.data(), c.elem);
    for (int j = 0; j < g && !even; ++j) {
      const Box part = intersect(c.have, member_box(c, c.after, j));
      ops.copy_box(cur, c.have.shape, relative(part, c.have),
                   send.data() + static_cast<std::size_t>(j) * piece_bytes, piece, origin,
                   part.shape, c.elem);
    }
    std::byte* const to = direct_recv || strided_recv ? out : recv.data();
    if constexpr (StridedLink<L>) {
      const StridedPieces contiguous{1, piece_bytes, piece_bytes * static_cast<std::size_t>(g)};
      if (strided_send || strided_recv)
        co_await link.all_to_all_strided(
            k, cur, to, strided_send ? pieces_along(c.have.shape, j_dim, g, c.elem) : contiguous,
            strided_recv ? pieces_along(c.want.shape, i, g, c.elem) : contiguous);
    }
    if (!strided_send && !strided_recv)
      co_await link.all_to_all(k, direct_send ? cur : send.data(), to, piece_bytes);
    if (even && !direct_recv && !strided_recv)
      ops.unpack_pieces(recv.data(), out, c.want.shape, i, g, c.elem);
    for (int j = 0; j < g && !even; ++j) {
      const Box part = intersect(member_box(c, c.before, j), c.want);
      ops.copy_box(recv.data() + static_cast<std::size_t>(j) * piece_bytes, piece, origin, out,
                   c.want.shape, relative(part, c.want), part.shape, c.elem);
    }
    co_return send.size() + recv.size();
  }
  // Exact: what each member sends packed at its offset, what it receives staged at another;
  // sent from the block as it lies where the pieces are slabs of it, received into the target
  // where they are slabs of that (and it is not the block too).
  const bool direct_send = slabs_along(c.have.shape, j_dim);
  const bool direct_recv = slabs_along(c.want.shape, i) && cur != out;
  const std::vector<std::size_t> send_at =
      packed_offsets(c, [&](int j) { return intersect(c.have, member_box(c, c.after, j)); });
  const std::vector<std::size_t> recv_at =
      packed_offsets(c, [&](int j) { return intersect(member_box(c, c.before, j), c.want); });
  auto packed = ops.allocate(direct_send ? 0 : send_at.back());
  auto staging = ops.allocate(direct_recv ? 0 : recv_at.back());
  std::vector<SendMessage> sends;
  std::vector<RecvMessage> recvs;
  for (int j = 0; j < g; ++j) {
    const auto u = static_cast<std::size_t>(j);
    const Box to_j = intersect(c.have, member_box(c, c.after, j));
    if (j == me) {
      copy_piece(ops, cur, c.have, out, c.want, to_j, c.elem);
      continue;
    }
    if (send_at[u + 1] > send_at[u]) {
      const std::byte* piece = cur + (direct_send ? slab_offset(to_j, c.have, c.elem) : 0);
      if (!direct_send) {
        piece = packed.data() + send_at[u];
        copy_piece(ops, cur, c.have, packed.data() + send_at[u], to_j, to_j, c.elem);
      }
      sends.push_back({global_rank(c, j), piece, send_at[u + 1] - send_at[u]});
    }
    if (recv_at[u + 1] > recv_at[u]) {
      const Box from_j = intersect(member_box(c, c.before, j), c.want);
      std::byte* to =
          direct_recv ? out + slab_offset(from_j, c.want, c.elem) : staging.data() + recv_at[u];
      recvs.push_back({global_rank(c, j), to, recv_at[u + 1] - recv_at[u]});
    }
  }
  co_await link.exchange(sends, recvs);
  for (int j = 0; j < g && !direct_recv; ++j) {
    if (j == me) continue;
    const Box from_j = intersect(member_box(c, c.before, j), c.want);
    copy_piece(ops, staging.data() + recv_at[static_cast<std::size_t>(j)], from_j, out, c.want,
               from_j, c.elem);
  }
  co_return packed.size() + staging.size();
}

// An all-reduce as one point-to-point round (a step of a batch's round whose steps differ): every
// member's piece is the whole block (run_exchange_reduce), so every member computes
// bit-identical values.
template <class L, class Ops>
Task<std::size_t> run_all_reduce_exact(L link, const Ops& ops, const StepContext& c,
                                       const std::byte* cur, std::byte* out) {
  co_return co_await run_exchange_reduce(link, ops, c, cur, out, true,
                                         [&c](int /*member*/) { return c.have; });
}

template <class L, class Ops>
Task<std::size_t> run_exchange(L link, const Ops& ops, const StepContext& c, const std::byte* cur,
                               std::byte* out) {
  const Layout& base = c.plan.src();
  const DeviceMesh& mesh = base.mesh();
  // Pieces to other ranks packed one after another, pieces from them staged the same way.
  struct Piece {
    int peer = 0;
    Box box;
    std::size_t at = 0;
  };
  std::vector<Piece> outgoing, incoming;
  std::size_t send_bytes = 0, recv_bytes = 0;
  for_each_exchange_target(base, c.step.before, c.step.after, c.me,
                           [&](const MeshCoord& receiver, const Box& piece) {
                             if (receiver == c.me) return;
                             outgoing.push_back({mesh.rank(receiver), piece, send_bytes});
                             send_bytes += bytes_of(piece, c.elem);
                           });
  for_each_exchange_source(base, c.step.before, c.step.after, c.me,
                           [&](const MeshCoord& source, const Box& piece) {
                             if (source == c.me) {
                               copy_piece(ops, cur, c.have, out, c.want, piece, c.elem);
                               return;
                             }
                             incoming.push_back({mesh.rank(source), piece, recv_bytes});
                             recv_bytes += bytes_of(piece, c.elem);
                           });
  auto packed = ops.allocate(send_bytes);
  auto staging = ops.allocate(recv_bytes);
  std::vector<SendMessage> sends;
  std::vector<RecvMessage> recvs;
  sends.reserve(outgoing.size());
  recvs.reserve(incoming.size());
  for (const Piece& p : outgoing) {
    copy_piece(ops, cur, c.have, packed.data() + p.at, p.box, p.box, c.elem);
    sends.push_back({p.peer, packed.data() + p.at, bytes_of(p.box, c.elem)});
  }
  for (const Piece& p : incoming)
    recvs.push_back({p.peer, staging.data() + p.at, bytes_of(p.box, c.elem)});
  co_await link.exchange(sends, recvs);
  for (const Piece& p : incoming)
    copy_piece(ops, staging.data() + p.at, p.box, out, c.want, p.box, c.elem);
  co_return packed.size() + staging.size();
}

// R -> P(op) on mesh dim k, in place on `out` (a copy of the replicated block).
template <class Ops>
void make_partial(const Ops& ops, const StepContext& c, std::byte* out) {
  const int k = c.step.mesh_dim;
  const ReduceOp op = c.step.after[k].reduce_op();
  const int g = c.plan.src().mesh().size(k);
  const DType dtype = c.plan.src().dtype();
  const auto count = static_cast<std::size_t>(c.want.numel());
  const bool keep_one =
      op == ReduceOp::product || (op == ReduceOp::sum && (c.plan.options().partial_from_replicate ==
                                                              PartialFromReplicate::keep_one ||
                                                          !is_floating(dtype)));
  if (keep_one) {
    if (c.me[k] != 0) ops.fill_identity(dtype, out, count, op);
  } else if (op == ReduceOp::sum) {
    ops.divide(dtype, out, count, g);
  }
}

// S(i) -> P(op): the shard placed in a block of the op's identity. avg has no identity: the
// shard goes in scaled by g among zeros, so that the group's average is the value.
template <class Ops>
void fill_partial(const Ops& ops, const StepContext& c, const std::byte* cur, std::byte* out) {
  const ReduceOp op = c.step.after[c.step.mesh_dim].reduce_op();
  const DType dtype = c.plan.src().dtype();
  const auto count = static_cast<std::size_t>(c.want.numel());
  ops.fill_identity(dtype, out, count, op);
  copy_piece(ops, cur, c.have, out, c.want, c.have, c.elem);
  // The rest of the block is 0, so scaling all of it scales just the piece.
  if (op == ReduceOp::avg)
    ops.multiply(dtype, out, count, c.plan.src().mesh().size(c.step.mesh_dim));
}

// Every step of `plan` on the rank at `me`: reads its source block from `src`, writes its
// target block to `dst`, and records in `*scratch_peak` (when given) the most scratch memory it
// held at once. The steps whose bit is set in `point_to_point` run as point-to-point messages
// with exact pieces (a batch's round whose steps differ; BatchPlan::point_to_point).
template <class L>
Task<void> run_plan(const Plan& plan, L link, MeshCoord me, const std::byte* src, std::byte* dst,
                    std::int64_t* scratch_peak, std::uint32_t point_to_point = 0) {
  static_assert(max_plan_steps <= 32, "point_to_point has one bit per step");
  const auto ops = local_ops_of(link.backend);
  const auto elem = static_cast<std::size_t>(plan.src().elem_bytes());
  if (plan.empty()) {
    const std::size_t bytes = bytes_of(plan.dst().local_box(me), elem);
    if (bytes && dst != src) ops.copy(dst, src, bytes);
    co_return;
  }
  const std::byte* cur = src;
  // Blocks between steps, reused: each grows to the largest block it holds.
  using Buffer = std::remove_cvref_t<decltype(ops.allocate(0))>;
  Buffer buffers[2];
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const bool messages = (point_to_point >> i & 1u) != 0;
    Step exact = plan[i];
    exact.padded = false;
    const Step& step = messages ? exact : plan[i];
    const StepContext c{plan,
                        step,
                        plan.src().with_placements(step.before),
                        plan.src().with_placements(step.after),
                        me,
                        plan.src().local_box(step.before, me),
                        plan.src().local_box(step.after, me),
                        elem,
                        !messages && step_is_even(plan, step)};
    std::byte* out = dst;
    if (i + 1 < plan.size()) {
      Buffer& next = buffers[i % 2];
      if (next.size() < bytes_of(c.want, elem)) next = ops.allocate(bytes_of(c.want, elem));
      out = next.data();
    }
    std::size_t staged = 0;
    switch (step.kind) {
      case StepKind::identity:
      case StepKind::chunk:
        // An identity step's group is one rank: its block is unchanged.
        copy_piece(ops, cur, c.have, out, c.want, c.want, elem);
        break;
      case StepKind::scale:
        ops.copy(out, cur, bytes_of(c.want, elem));
        make_partial(ops, c, out);
        break;
      case StepKind::fill: fill_partial(ops, c, cur, out); break;
      case StepKind::all_gather: staged = co_await run_all_gather(link, ops, c, cur, out); break;
      case StepKind::reduce_scatter:
        staged = co_await run_reduce_scatter(link, ops, c, cur, out);
        break;
      case StepKind::all_reduce:
        if (messages) {
          staged = co_await run_all_reduce_exact(link, ops, c, cur, out);
          break;
        }
        co_await link.all_reduce(step.mesh_dim, cur, out, static_cast<std::size_t>(c.have.numel()),
                                 plan.src().dtype(), step.before[step.mesh_dim].reduce_op());
        break;
      case StepKind::all_to_all: staged = co_await run_all_to_all(link, ops, c, cur, out); break;
      case StepKind::exchange: staged = co_await run_exchange(link, ops, c, cur, out); break;
    }
    if (scratch_peak != nullptr) {
      const auto held = static_cast<std::int64_t>(buffers[0].size() + buffers[1].size() + staged);
      *scratch_peak = std::max(*scratch_peak, held);
    }
    cur = out;
  }
}

}  // namespace dtensor::detail
