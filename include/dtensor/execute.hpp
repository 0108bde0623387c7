#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "backend.hpp"
#include "detail/box_copy.hpp"
#include "detail/elementwise.hpp"
#include "detail/step_cost.hpp"
#include "detail/why.hpp"
#include "errors.hpp"
#include "plan.hpp"
#include "planner.hpp"

// Running a plan on real buffers: every rank calls execute() with its own backend and its
// blocks of the source and target layouts (row-major, contiguous). Host memory.
namespace dtensor {

namespace detail {

// How a collective step moves uneven pieces on this group: a native collective on pieces of one
// size (even, or padded), or exact sizes in one point-to-point round.
enum class Movement { native, exact };

struct StepContext {
  const Plan& plan;
  const Step& step;
  Layout before, after;
  MeshCoord me;
  Box have, want;
  std::size_t elem;
  // Every group of the step cuts its pieces equally: one native collective everywhere. The
  // choice must be the same on every rank, since an exact step is a mesh-wide round.
  bool even;
};

// Whether, for every rank, the tensor dims the step gathers (i) or scatters (j) divide evenly
// among its group.
inline bool step_is_even(const Plan& plan, const Step& s) {
  if (s.kind != StepKind::all_gather && s.kind != StepKind::reduce_scatter &&
      s.kind != StepKind::all_to_all)
    return true;
  const Layout& base = plan.src();
  const DeviceMesh& mesh = base.mesh();
  const int k = s.mesh_dim, g = mesh.size(k);
  const int i = s.kind == StepKind::reduce_scatter ? -1 : s.before[k].dim();
  const int j = s.kind == StepKind::all_gather ? -1 : s.after[k].dim();
  for (int r = 0; r < mesh.size(); ++r) {
    const MeshCoord c = mesh.coordinate(mesh.rank_at(r));
    if (i >= 0 && base.local_box(s.after, c).shape[i] % g != 0) return false;
    if (j >= 0 && base.local_box(s.before, c).shape[j] % g != 0) return false;
  }
  return true;
}

inline std::size_t bytes_of(const Box& b, std::size_t elem) {
  return static_cast<std::size_t>(b.numel()) * elem;
}

inline Shape relative(const Box& inner, const Box& outer) {
  Shape s = inner.offset;
  for (std::size_t d = 0; d < s.size(); ++d) s[d] -= outer.offset[d];
  return s;
}

// Staging memory: uninitialised (no pass to zero it) unless asked, since every byte that
// matters is written before it is read.
struct Scratch {
  std::unique_ptr<std::byte[]> bytes;
  std::size_t size = 0;

  Scratch() = default;
  explicit Scratch(std::size_t n, bool zero = false)
      : bytes(zero ? std::make_unique<std::byte[]>(n)
                   : std::make_unique_for_overwrite<std::byte[]>(n)),
        size(n) {}
  std::byte* data() noexcept { return bytes.get(); }
};

// Whether the pieces of `shape` along dim d are contiguous slabs of a row-major buffer (every
// dim before d has extent 1), so that a gather or scatter along d needs no block transpose.
inline bool slabs_along(const Shape& shape, int d) {
  for (int i = 0; i < d; ++i)
    if (shape[i] != 1) return false;
  return true;
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

// Copies `piece` (a block of the tensor inside both `from_box` and `to_box`) between buffers.
inline void copy_piece(const std::byte* from, const Box& from_box, std::byte* to, const Box& to_box,
                       const Box& piece, std::size_t elem) {
  copy_box(from, from_box.shape, relative(piece, from_box), to, to_box.shape,
           relative(piece, to_box), piece.shape, elem);
}

// The padded piece shape: `box` with each listed dim widened to the group's largest piece.
inline Shape padded_shape(const StepContext& c, Shape shape, int dim, std::int64_t range) {
  shape[dim] =
      chunk_range(range, c.plan.src().mesh().size(c.step.mesh_dim), 0, c.plan.src().policy()).size;
  return shape;
}

// Each run_* performs one step and returns the bytes of staging it allocated.
template <class B>
std::size_t run_all_gather(B& backend, const StepContext& c, const std::byte* cur, std::byte* out) {
  const int k = c.step.mesh_dim, i = c.step.before[k].dim();
  const int g = c.plan.src().mesh().size(k), me = c.me[k];
  const bool even = c.even;
  if (even || c.step.padded) {
    Box piece{Shape(c.have.shape.size(), 0), padded_shape(c, c.have.shape, i, c.want.shape[i])};
    const std::size_t piece_bytes = bytes_of(piece, c.elem);
    const bool exact = piece.shape == c.have.shape;
    // Zero-copy: send the block as it is when it is a whole piece; receive straight into the
    // target when every member's piece is whole (even) and they stack as slabs of it.
    const bool direct = even && slabs_along(c.want.shape, i);
    Scratch send(exact ? 0 : piece_bytes, true);
    Scratch recv(direct ? 0 : piece_bytes * static_cast<std::size_t>(g));
    if (!exact)
      copy_box(cur, c.have.shape, Shape(c.have.shape.size(), 0), send.data(), piece.shape,
               Shape(c.have.shape.size(), 0), c.have.shape, c.elem);
    backend.all_gather(k, exact ? cur : send.data(), direct ? out : recv.data(), piece_bytes);
    for (int j = 0; j < g && !direct; ++j) {
      const Box bj = member_box(c, c.before, j);
      copy_box(recv.data() + static_cast<std::size_t>(j) * piece_bytes, piece.shape,
               Shape(piece.shape.size(), 0), out, c.want.shape, relative(bj, c.want), bj.shape,
               c.elem);
    }
    return send.size + recv.size;
  }
  std::vector<std::vector<std::byte>> staging(static_cast<std::size_t>(g));
  std::vector<SendMessage> sends;
  std::vector<RecvMessage> recvs;
  for (int j = 0; j < g; ++j) {
    if (j == me) continue;
    const Box bj = member_box(c, c.before, j);
    staging[static_cast<std::size_t>(j)].resize(bytes_of(bj, c.elem));
    if (!c.have.empty()) sends.push_back({global_rank(c, j), cur, bytes_of(c.have, c.elem)});
    if (!bj.empty())
      recvs.push_back(
          {global_rank(c, j), staging[static_cast<std::size_t>(j)].data(), bytes_of(bj, c.elem)});
  }
  backend.exchange(sends, recvs);
  for (int j = 0; j < g; ++j) {
    const Box bj = member_box(c, c.before, j);
    const std::byte* from = j == me ? cur : staging[static_cast<std::size_t>(j)].data();
    copy_piece(from, bj, out, c.want, bj, c.elem);
  }
  std::size_t staged = 0;
  for (const auto& v : staging) staged += v.size();
  return staged;
}

template <class B>
std::size_t run_reduce_scatter(B& backend, const StepContext& c, const std::byte* cur,
                               std::byte* out) {
  const int k = c.step.mesh_dim, j_dim = c.step.after[k].dim();
  const int g = c.plan.src().mesh().size(k), me = c.me[k];
  const ReduceOp op = c.step.before[k].reduce_op();
  const DType dtype = c.plan.src().dtype();
  const bool even = c.even;
  if (even || c.step.padded) {
    const Shape piece = padded_shape(c, c.want.shape, j_dim, c.have.shape[j_dim]);
    const Box piece_box{Shape(piece.size(), 0), piece};
    const std::size_t piece_bytes = bytes_of(piece_box, c.elem);
    const bool exact = piece == c.want.shape;
    // Zero-copy: send the block itself when the group is even and its pieces are slabs of it;
    // receive into the target when this member's piece needs no padding.
    const bool direct_send = even && slabs_along(c.have.shape, j_dim);
    Scratch send(direct_send ? 0 : piece_bytes * static_cast<std::size_t>(g), !exact);
    Scratch recv(exact ? 0 : piece_bytes);
    for (int j = 0; j < g && !direct_send; ++j) {
      const Box aj = member_box(c, c.after, j);
      copy_box(cur, c.have.shape, relative(aj, c.have),
               send.data() + static_cast<std::size_t>(j) * piece_bytes, piece,
               Shape(piece.size(), 0), aj.shape, c.elem);
    }
    backend.reduce_scatter(k, direct_send ? cur : send.data(), exact ? out : recv.data(),
                           static_cast<std::size_t>(piece_box.numel()), dtype, op);
    if (!exact)
      copy_box(recv.data(), piece, Shape(piece.size(), 0), out, c.want.shape,
               Shape(piece.size(), 0), c.want.shape, c.elem);
    return send.size + recv.size;
  }
  // Exact: each member sends every other member its partial of that member's piece, then
  // reduces the g partials of its own piece in group order.
  const std::size_t own_bytes = bytes_of(c.want, c.elem);
  std::vector<std::vector<std::byte>> packed(static_cast<std::size_t>(g));
  std::vector<std::byte> partials(own_bytes * static_cast<std::size_t>(g));
  std::vector<SendMessage> sends;
  std::vector<RecvMessage> recvs;
  for (int j = 0; j < g; ++j) {
    const Box aj = member_box(c, c.after, j);
    auto& buf = packed[static_cast<std::size_t>(j)];
    buf.resize(bytes_of(aj, c.elem));
    copy_piece(cur, c.have, buf.data(), aj, aj, c.elem);
    if (j == me) {
      if (own_bytes)
        std::memcpy(partials.data() + static_cast<std::size_t>(j) * own_bytes, buf.data(),
                    own_bytes);
      continue;
    }
    if (!aj.empty()) sends.push_back({global_rank(c, j), buf.data(), buf.size()});
    if (own_bytes)
      recvs.push_back({global_rank(c, j), partials.data() + static_cast<std::size_t>(j) * own_bytes,
                       own_bytes});
  }
  backend.exchange(sends, recvs);
  visit_dtype(dtype, [&]<class T>() {
    std::vector<const T*> parts(static_cast<std::size_t>(g));
    for (int j = 0; j < g; ++j)
      parts[static_cast<std::size_t>(j)] =
          reinterpret_cast<const T*>(partials.data() + static_cast<std::size_t>(j) * own_bytes);
    reduce_into(reinterpret_cast<T*>(out), parts.data(), g,
                static_cast<std::size_t>(c.want.numel()), op);
  });
  std::size_t staged = partials.size();
  for (const auto& v : packed) staged += v.size();
  return staged;
}

template <class B>
std::size_t run_all_to_all(B& backend, const StepContext& c, const std::byte* cur, std::byte* out) {
  const int k = c.step.mesh_dim;
  const int i = c.step.before[k].dim(), j_dim = c.step.after[k].dim();
  const int g = c.plan.src().mesh().size(k), me = c.me[k];
  const bool even = c.even;
  if (even || c.step.padded) {
    Shape piece = c.have.shape;
    piece = padded_shape(c, piece, i, c.want.shape[i]);
    piece = padded_shape(c, piece, j_dim, c.have.shape[j_dim]);
    const Box piece_box{Shape(piece.size(), 0), piece};
    const std::size_t piece_bytes = bytes_of(piece_box, c.elem);
    // Zero-copy where the pieces are slabs: of the block along j (send), of the target along i
    // (receive).
    const bool direct_send = even && slabs_along(c.have.shape, j_dim);
    const bool direct_recv = even && slabs_along(c.want.shape, i);
    Scratch send(direct_send ? 0 : piece_bytes * static_cast<std::size_t>(g), !even);
    Scratch recv(direct_recv ? 0 : piece_bytes * static_cast<std::size_t>(g));
    for (int j = 0; j < g && !direct_send; ++j) {
      const Box part = intersect(c.have, member_box(c, c.after, j));
      copy_box(cur, c.have.shape, relative(part, c.have),
               send.data() + static_cast<std::size_t>(j) * piece_bytes, piece,
               Shape(piece.size(), 0), part.shape, c.elem);
    }
    backend.all_to_all(k, direct_send ? cur : send.data(), direct_recv ? out : recv.data(),
                       piece_bytes);
    for (int j = 0; j < g && !direct_recv; ++j) {
      const Box part = intersect(member_box(c, c.before, j), c.want);
      copy_box(recv.data() + static_cast<std::size_t>(j) * piece_bytes, piece,
               Shape(piece.size(), 0), out, c.want.shape, relative(part, c.want), part.shape,
               c.elem);
    }
    return send.size + recv.size;
  }
  std::vector<std::vector<std::byte>> packed(static_cast<std::size_t>(g)),
      staging(static_cast<std::size_t>(g));
  std::vector<SendMessage> sends;
  std::vector<RecvMessage> recvs;
  for (int j = 0; j < g; ++j) {
    const Box to_j = intersect(c.have, member_box(c, c.after, j));
    const Box from_j = intersect(member_box(c, c.before, j), c.want);
    if (j == me) {
      copy_piece(cur, c.have, out, c.want, to_j, c.elem);
      continue;
    }
    auto& p = packed[static_cast<std::size_t>(j)];
    p.resize(bytes_of(to_j, c.elem));
    copy_piece(cur, c.have, p.data(), to_j, to_j, c.elem);
    if (!p.empty()) sends.push_back({global_rank(c, j), p.data(), p.size()});
    auto& s = staging[static_cast<std::size_t>(j)];
    s.resize(bytes_of(from_j, c.elem));
    if (!s.empty()) recvs.push_back({global_rank(c, j), s.data(), s.size()});
  }
  backend.exchange(sends, recvs);
  for (int j = 0; j < g; ++j) {
    if (j == me) continue;
    const Box from_j = intersect(member_box(c, c.before, j), c.want);
    copy_piece(staging[static_cast<std::size_t>(j)].data(), from_j, out, c.want, from_j, c.elem);
  }
  std::size_t staged = 0;
  for (const auto& v : packed) staged += v.size();
  for (const auto& v : staging) staged += v.size();
  return staged;
}

template <class B>
std::size_t run_exchange(B& backend, const StepContext& c, const std::byte* cur, std::byte* out) {
  const Layout& base = c.plan.src();
  const DeviceMesh& mesh = base.mesh();
  std::vector<std::vector<std::byte>> packed, staging;
  std::vector<Box> staged_boxes;
  std::vector<SendMessage> sends;
  std::vector<RecvMessage> recvs;
  for_each_exchange_target(base, c.step.before, c.step.after, c.me,
                           [&](const MeshCoord& receiver, const Box& piece) {
                             if (receiver == c.me) return;
                             packed.emplace_back(bytes_of(piece, c.elem));
                             copy_piece(cur, c.have, packed.back().data(), piece, piece, c.elem);
                           });
  for_each_exchange_source(base, c.step.before, c.step.after, c.me,
                           [&](const MeshCoord& source, const Box& piece) {
                             if (source == c.me) {
                               copy_piece(cur, c.have, out, c.want, piece, c.elem);
                               return;
                             }
                             staging.emplace_back(bytes_of(piece, c.elem));
                             staged_boxes.push_back(piece);
                           });
  std::size_t p = 0;
  for_each_exchange_target(
      base, c.step.before, c.step.after, c.me, [&](const MeshCoord& receiver, const Box&) {
        if (receiver == c.me) return;
        sends.push_back({mesh.rank(receiver), packed[p].data(), packed[p].size()});
        ++p;
      });
  std::size_t s = 0;
  for_each_exchange_source(
      base, c.step.before, c.step.after, c.me, [&](const MeshCoord& source, const Box&) {
        if (source == c.me) return;
        recvs.push_back({mesh.rank(source), staging[s].data(), staging[s].size()});
        ++s;
      });
  backend.exchange(sends, recvs);
  for (std::size_t r = 0; r < staging.size(); ++r)
    copy_piece(staging[r].data(), staged_boxes[r], out, c.want, staged_boxes[r], c.elem);
  std::size_t staged = 0;
  for (const auto& v : packed) staged += v.size();
  for (const auto& v : staging) staged += v.size();
  return staged;
}

// R -> P(op) on mesh dim k, in place on `out` (a copy of the replicated block).
inline void make_partial(const StepContext& c, std::byte* out) {
  const int k = c.step.mesh_dim;
  const ReduceOp op = c.step.after[k].reduce_op();
  const int g = c.plan.src().mesh().size(k);
  const DType dtype = c.plan.src().dtype();
  const auto count = static_cast<std::size_t>(c.want.numel());
  const bool keep_one =
      op == ReduceOp::product || (op == ReduceOp::sum && (c.plan.options().partial_from_replicate ==
                                                              PartialFromReplicate::keep_one ||
                                                          !is_floating(dtype)));
  visit_dtype(dtype, [&]<class T>() {
    T* data = reinterpret_cast<T*>(out);
    if (keep_one) {
      if (c.me[k] != 0) fill_identity(data, count, op);
    } else if (op == ReduceOp::sum) {
      divide(data, count, g);
    }
  });
}

// S(i) -> P(op): the shard placed in a block of the op's identity. avg has no identity: the
// shard goes in scaled by g among zeros, so that the group's average is the value.
inline void fill_partial(const StepContext& c, const std::byte* cur, std::byte* out) {
  const ReduceOp op = c.step.after[c.step.mesh_dim].reduce_op();
  visit_dtype(c.plan.src().dtype(), [&]<class T>() {
    fill_identity(reinterpret_cast<T*>(out), static_cast<std::size_t>(c.want.numel()), op);
  });
  copy_piece(cur, c.have, out, c.want, c.have, c.elem);
  if (op != ReduceOp::avg) return;
  // The rest of the block is 0, so scaling all of it scales just the piece.
  const int g = c.plan.src().mesh().size(c.step.mesh_dim);
  visit_dtype(c.plan.src().dtype(), [&]<class T>() {
    multiply_by(reinterpret_cast<T*>(out), static_cast<std::size_t>(c.want.numel()), g);
  });
}

}  // namespace detail

namespace detail {

// Bytes of the send/receive staging one step allocates on the rank at `me`.
inline std::int64_t step_staging_bytes(const Plan& plan, std::size_t i, const MeshCoord& me) {
  const Step& s = plan[i];
  const Layout& base = plan.src();
  const std::int64_t elem = base.elem_bytes();
  const Box have = base.local_box(s.before, me), want = base.local_box(s.after, me);
  const int k = s.mesh_dim;
  switch (s.kind) {
    case StepKind::all_gather:
    case StepKind::reduce_scatter:
    case StepKind::all_to_all: {
      const int g = base.mesh().size(k);
      const bool gather = s.kind == StepKind::all_gather,
                 scatter = s.kind == StepKind::reduce_scatter;
      const int i_dim = gather || !scatter ? s.before[k].dim() : -1;
      const int j_dim = scatter || !gather ? s.after[k].dim() : -1;
      const bool even = step_is_even(plan, s);
      auto largest = [&](std::int64_t n) { return chunk_range(n, g, 0, base.policy()).size; };
      if (even || s.padded) {
        // One piece per member, padded to the largest.
        Shape piece = gather ? have.shape : want.shape;
        if (!gather && !scatter) piece = have.shape;
        if (i_dim >= 0) piece[i_dim] = largest(want.shape[i_dim]);
        if (j_dim >= 0) piece[j_dim] = largest(have.shape[j_dim]);
        std::int64_t p = 1;
        for (std::int64_t e : piece) p *= e;
        p *= elem;
        return gather || scatter ? (g + 1) * p : 2 * g * p;
      }
      // Exact: the point-to-point round's buffers. All-gather receives into staging and sends
      // its block as is; reduce-scatter packs every member's piece and keeps g partials of
      // its own; all-to-all packs what it sends and stages what it receives.
      const RankBytes b = step_rank_bytes(plan, i, base.mesh().rank(me));
      if (gather) return b.recv;
      if (scatter) return b.send + want.numel() * elem * (g + 1);
      return b.send + b.recv;
    }
    case StepKind::exchange: {
      const RankBytes b = step_rank_bytes(plan, i, base.mesh().rank(me));
      return b.send + b.recv;
    }
    default: return 0;
  }
}

}  // namespace detail

// Bytes of scratch memory execute() holds at most on any rank for this plan: the blocks
// between steps (two buffers, reused) plus the staging of the largest step. Not counted: the
// caller's source and target, and what a backend allocates inside its collectives.
inline std::int64_t workspace_bytes(const Plan& plan) {
  const DeviceMesh& mesh = plan.src().mesh();
  const std::int64_t elem = plan.src().elem_bytes();
  std::int64_t most = 0;
  for (int r = 0; r < mesh.size(); ++r) {
    const MeshCoord me = mesh.coordinate(mesh.rank_at(r));
    std::int64_t between[2] = {0, 0};
    for (std::size_t i = 0; i + 1 < plan.size(); ++i) {
      const std::int64_t b = plan.src().local_box(plan[i].after, me).numel() * elem;
      between[i % 2] = b > between[i % 2] ? b : between[i % 2];
    }
    std::int64_t staging = 0;
    for (std::size_t i = 0; i < plan.size(); ++i) {
      const std::int64_t b = detail::step_staging_bytes(plan, i, me);
      staging = b > staging ? b : staging;
    }
    const std::int64_t total = between[0] + between[1] + staging;
    most = total > most ? total : most;
  }
  return most;
}

// What one execute() call used, for tests and tuning.
struct ExecuteStats {
  // The most scratch memory held at once: blocks between steps plus a step's staging.
  std::int64_t scratch_peak_bytes = 0;
};

// Runs `plan` on this rank (backend.rank()): reads its block of plan.src() from `src` and writes
// its block of plan.dst() to `dst` (row-major, contiguous, host memory). `src_bytes` and
// `dst_bytes` are the buffers' sizes, checked against the blocks. The source is never written.
// Every rank of the mesh must call this with the same plan.
template <Backend B>
void execute(const Plan& plan, B& backend, const void* src, std::size_t src_bytes, void* dst,
             std::size_t dst_bytes, ExecuteStats* stats = nullptr) {
  static_assert(B::memory == MemorySpace::host, "dtensor::execute runs on host memory");
  if (!(backend.mesh() == plan.src().mesh()))
    detail::fail<detail::why::backend_mesh_mismatch>(backend.mesh().shape(),
                                                     plan.src().mesh().shape());
  const int rank = backend.rank();
  const MeshCoord me = plan.src().mesh().coordinate(rank);
  const auto elem = static_cast<std::size_t>(plan.src().elem_bytes());
  const std::size_t need_src = detail::bytes_of(plan.src().local_box(me), elem);
  const std::size_t need_dst = detail::bytes_of(plan.dst().local_box(me), elem);
  if (src_bytes < need_src)
    detail::fail<detail::why::buffer_too_small>("source", src_bytes, rank, need_src);
  if (dst_bytes < need_dst)
    detail::fail<detail::why::buffer_too_small>("target", dst_bytes, rank, need_dst);

  if (plan.empty()) {
    if (need_dst && dst != src) std::memmove(dst, src, need_dst);
    return;
  }
  const auto* cur = static_cast<const std::byte*>(src);
  // Blocks between steps, reused: each grows to the largest block it holds.
  detail::Scratch buffers[2];
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Step& step = plan[i];
    const detail::StepContext c{plan,
                                step,
                                plan.src().with_placements(step.before),
                                plan.src().with_placements(step.after),
                                me,
                                plan.src().local_box(step.before, me),
                                plan.src().local_box(step.after, me),
                                elem,
                                detail::step_is_even(plan, step)};
    const bool last = i + 1 == plan.size();
    std::byte* out;
    if (last) {
      out = static_cast<std::byte*>(dst);
    } else {
      detail::Scratch& next = buffers[i % 2];
      if (next.size < detail::bytes_of(c.want, elem))
        next = detail::Scratch(detail::bytes_of(c.want, elem));
      out = next.data();
    }
    std::size_t staged = 0;
    switch (step.kind) {
      case StepKind::identity:
      case StepKind::chunk:
        // An identity step's group is one rank: its block is unchanged.
        detail::copy_piece(cur, c.have, out, c.want, c.want, elem);
        break;
      case StepKind::scale:
        if (c.want.numel()) std::memcpy(out, cur, detail::bytes_of(c.want, elem));
        detail::make_partial(c, out);
        break;
      case StepKind::fill: detail::fill_partial(c, cur, out); break;
      case StepKind::all_gather: staged = detail::run_all_gather(backend, c, cur, out); break;
      case StepKind::reduce_scatter:
        staged = detail::run_reduce_scatter(backend, c, cur, out);
        break;
      case StepKind::all_reduce:
        backend.all_reduce(step.mesh_dim, cur, out, static_cast<std::size_t>(c.have.numel()),
                           plan.src().dtype(), step.before[step.mesh_dim].reduce_op());
        break;
      case StepKind::all_to_all: staged = detail::run_all_to_all(backend, c, cur, out); break;
      case StepKind::exchange: staged = detail::run_exchange(backend, c, cur, out); break;
    }
    if (stats != nullptr) {
      const auto held = static_cast<std::int64_t>(buffers[0].size + buffers[1].size + staged);
      stats->scratch_peak_bytes = std::max(stats->scratch_peak_bytes, held);
    }
    cur = out;
  }
}

// Typed spans: the element type must be the plan's dtype.
template <Backend B, class T>
void execute(const Plan& plan, B& backend, std::span<const T> src, std::span<T> dst,
             ExecuteStats* stats = nullptr) {
  if (dtype_of<T> != plan.src().dtype())
    detail::fail<detail::why::span_dtype_mismatch>(name(dtype_of<T>), name(plan.src().dtype()));
  execute(plan, backend, src.data(), src.size_bytes(), dst.data(), dst.size_bytes(), stats);
}

}  // namespace dtensor
