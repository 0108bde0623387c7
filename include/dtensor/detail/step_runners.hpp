#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "../backend.hpp"
#include "../plan.hpp"
#include "../planner.hpp"
#include "link.hpp"
#include "round_shifts_memo.hpp"
#include "stages.hpp"
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
  Layout before, after;
  MeshCoord me;
  Box have, want;
  std::size_t elem = 0;
  // Every group of the step cuts its pieces equally: one native collective everywhere. The
  // choice must be the same on every rank, since an exact step is a mesh-wide round.
  bool even = false;
  // Run as point-to-point messages with exact pieces (a batch's round whose steps differ).
  bool messages = false;
  Step step;  // padded cleared when `messages`
  // Room in the caller's target that holds no block during this step (run_plan), where the
  // step may put its staging instead of allocating it: `spare_bytes` at `spare` (null when
  // only sizes are computed).
  std::byte* spare = nullptr;
  std::size_t spare_bytes = 0;
  // The bytes of the buffer the step writes its block into, at its start, where that is the
  // caller's target (run_plan); 0 otherwise. Past the block they hold nothing during the step
  // (an exchange may stage there, exchange_way).
  std::size_t out_bytes = 0;
  // Run in bands (band_rows): the rows of tensor dim 0 this call moves; every block and piece
  // of the step is cut to them.
  bool banded = false;
  Range band{};
  // The block the step reads may be overwritten once read (it lies in scratch or in the
  // caller's target, not in the caller's source): reduces_in_rounds receives into it, a
  // reduce-scatter over a pair packs its pieces in it (ScatterWay::pack_in_block).
  bool block_writable = false;
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
  Box b = l.local_box(m);
  if (c.banded) {
    b.offset[0] = c.band.start;
    b.shape[0] = c.band.size;
  }
  return b;
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
  if (from == to && from_box == to_box) return;  // in place (runs_in_place): already there
  ops.copy_box(from, from_box.shape, relative(piece, from_box), to, to_box.shape,
               relative(piece, to_box), piece.shape, elem);
}

// The padded piece shape: `box` with each listed dim widened to the group's largest piece.
inline Shape padded_shape(const StepContext& c, Shape shape, int dim, std::int64_t range) {
  shape[dim] =
      chunk_range(range, c.plan.src().mesh().size(c.step.mesh_dim), 0, c.plan.src().policy()).size;
  return shape;
}

// What a link does beyond the Backend concept that spares a step its staging.
struct LinkAbilities {
  bool strided_all_to_all = false;  // sends and receives strided pieces (StridedLink)
  bool strided_all_gather = false;  // receives an all-gather's strided pieces (StridedGatherLink)
  bool strided_exchange = false;    // point-to-point messages strided (StridedExchangeLink)
  bool one_call_per_step = false;   // a step is one operation (a batch's rounds): no bands
  // An even reduce-scatter or an all-reduce of blocks of at least this many bytes runs as
  // point-to-point rounds reduced here (B::reduce_messages_bytes): never by default.
  std::size_t reduce_messages_from = std::numeric_limits<std::size_t>::max();
  bool fills_in_place = false;  // its local ops fill around a block in place (FillsInPlaceLink)

  friend constexpr bool operator==(const LinkAbilities&, const LinkAbilities&) noexcept = default;
};

// A link whose backend's local ops move a block into a larger one around it in place
// (HostOps::fill_around_in_place): a fill can then run in its target.
template <class L>
concept FillsInPlaceLink = requires(L& link, void* p, const Shape& s, DType t, ReduceOp op) {
  local_ops_of(link.backend).fill_around_in_place(t, p, s, s, s, op);
};

template <class L>
inline constexpr LinkAbilities abilities_of{
    StridedLink<L>, StridedGatherLink<L>,         StridedExchangeLink<L>,
    false,          reduce_messages_of<L>::bytes, FillsInPlaceLink<L>};

// The abilities of a run straight on `backend` (a Link<B>): its type's, with the backend's own
// threshold for reductions by messages (reduce_messages_from).
template <class B>
LinkAbilities backend_abilities(const B& backend) {
  LinkAbilities a = abilities_of<Link<B>>;
  a.reduce_messages_from = reduce_messages_from(backend);
  return a;
}

// The abilities of one link: backend_abilities for a Link, its type's otherwise.
template <class L>
LinkAbilities link_abilities(const L& /*link*/) {
  return abilities_of<L>;
}
template <class B>
LinkAbilities link_abilities(const Link<B>& link) {
  return backend_abilities(link.backend);
}

// Where `piece`, a box inside the row-major block `block`, lies in it as runs of one stride:
// its first byte, and its runs (StridedPieces of one piece). None when its rows are not one
// stride apart (two dims it cuts short, with a dim it spans whole or not at all between).
struct PieceRuns {
  std::size_t offset = 0;
  StridedPieces runs;
};
inline std::optional<PieceRuns> runs_of(const Box& piece, const Box& block, std::size_t elem) {
  const auto n = static_cast<int>(block.shape.size());
  if (piece.empty()) return PieceRuns{0, {0, 0, 0}};
  // A run: the innermost dims the piece spans whole, and the first one it cuts short.
  int q = n - 1;
  std::size_t run = elem;
  while (q >= 0 && piece.shape[q] == block.shape[q])
    run *= static_cast<std::size_t>(block.shape[q--]);
  if (q < 0) return PieceRuns{0, {1, run, run}};
  run *= static_cast<std::size_t>(piece.shape[q]);
  std::size_t stride = elem;
  for (int d = q; d < n; ++d) stride *= static_cast<std::size_t>(block.shape[d]);
  // The rows: the dims before q (those of extent 1 aside), spanned whole up to one the piece
  // cuts short; every dim before that one, the piece takes one index of.
  std::size_t rows = 1;
  int d = q - 1;
  for (; d >= 0; --d) {
    if (block.shape[d] == 1) continue;
    if (piece.shape[d] != block.shape[d]) {
      rows *= static_cast<std::size_t>(piece.shape[d--]);
      break;
    }
    rows *= static_cast<std::size_t>(piece.shape[d]);
  }
  for (; d >= 0; --d)
    if (piece.shape[d] != 1) return std::nullopt;
  if (rows == 1) stride = run;
  return PieceRuns{slab_offset(piece, block, elem), {rows, run, stride}};
}

// A step's two staging buffers, what it packs to send and what it stages as received (bytes),
// and which of them lie in the spare room of the caller's target instead of being allocated.
struct Staging {
  std::size_t send = 0, recv = 0;
  bool send_zeroed = false;  // the send buffer starts zero-filled: allocated, never spare room
  bool send_spare = false, recv_spare = false;

  [[nodiscard]] std::size_t allocated() const {
    return (send_spare ? 0 : send) + (recv_spare ? 0 : recv);
  }
  // Both buffers in `spare` bytes if they fit together, else the larger one that fits.
  void use_spare(std::size_t spare) {
    const bool send_fits = !send_zeroed && send > 0 && send <= spare;
    const bool recv_fits = recv > 0 && recv <= spare;
    send_spare = send_fits && (!recv_fits || send + recv <= spare || send >= recv);
    recv_spare = recv_fits && (!send_spare || send + recv <= spare);
  }
  // The same two buffers placed in `spare` bytes of room instead (use_spare).
  [[nodiscard]] Staging with_spare(std::size_t spare) const {
    Staging s = *this;
    s.use_spare(spare);
    return s;
  }
};

// The staging buffers of one step, allocated or in the spare room (`spare`) as `s` says.
template <class Ops>
struct StagingBuffers {
  using Buffer = std::remove_cvref_t<decltype(std::declval<const Ops&>().allocate(0))>;
  Buffer send_buffer, recv_buffer;
  std::byte* send;
  std::byte* recv;

  StagingBuffers(const Ops& ops, const Staging& s, std::byte* spare)
      : send_buffer(ops.allocate(s.send_spare ? 0 : s.send, s.send_zeroed)),
        recv_buffer(ops.allocate(s.recv_spare ? 0 : s.recv)),
        send(s.send_spare ? spare : send_buffer.data()),
        recv(s.recv_spare ? spare + (s.send_spare ? s.send : 0) : recv_buffer.data()) {}
  [[nodiscard]] std::size_t allocated() const { return send_buffer.size() + recv_buffer.size(); }
};

// The messages of one point-to-point round, each contiguous or strided where it lies.
struct Messages {
  std::vector<StridedSendMessage> sends;
  std::vector<StridedRecvMessage> recvs;
  void send(int peer, const void* data, std::size_t bytes) {
    sends.push_back({peer, data, {1, bytes, bytes}});
  }
  void send(int peer, const void* data, StridedPieces runs) { sends.push_back({peer, data, runs}); }
  void recv(int peer, void* data, std::size_t bytes) {
    recvs.push_back({peer, data, {1, bytes, bytes}});
  }
  void recv(int peer, void* data, StridedPieces runs) { recvs.push_back({peer, data, runs}); }
};

// Messages as contiguous ones (each strided message's runs one after another: a link without
// strided messages is given only messages of one run).
struct ContiguousMessages {
  std::vector<SendMessage> sends;
  std::vector<RecvMessage> recvs;
};
inline ContiguousMessages contiguous(const Messages& m) {
  ContiguousMessages out;
  out.sends.reserve(m.sends.size());
  out.recvs.reserve(m.recvs.size());
  for (const StridedSendMessage& x : m.sends)
    out.sends.push_back({x.peer, x.data, x.runs.piece_bytes()});
  for (const StridedRecvMessage& x : m.recvs)
    out.recvs.push_back({x.peer, x.data, x.runs.piece_bytes()});
  return out;
}

// Runs the round: as strided messages where one is (the ways below choose them only on a link
// that moves them, abilities_of), as contiguous ones otherwise.
template <class L>
Task<void> send_and_receive(L link, const Messages& m) {
  if constexpr (StridedExchangeLink<L>) {
    auto strided = [](const auto& x) { return x.runs.rows > 1; };
    if (std::any_of(m.sends.begin(), m.sends.end(), strided) ||
        std::any_of(m.recvs.begin(), m.recvs.end(), strided)) {
      co_await link.exchange_strided(m.sends, m.recvs);
      co_return;
    }
  }
  const ContiguousMessages flat = contiguous(m);
  co_await link.exchange(flat.sends, flat.recvs);
}

// How an all-gather moves its pieces on this rank, and the staging that takes (bytes).
struct GatherWay : Staging {
  Shape piece;                  // native: every member's piece, padded to the largest
  std::size_t piece_bytes = 0;  // native
  bool whole = false;           // native: the block is a whole piece, sent as it is
  bool direct = false;          // pieces land straight in the target (slabs of it)
  bool strided = false;         // pieces land strided in the target (native: StridedGatherLink;
                                // exact: StridedExchangeLink)
  std::vector<std::size_t> at;  // exact: where each member's block is staged
};

inline GatherWay gather_way(const StepContext& c, LinkAbilities a) {
  const int k = c.step.mesh_dim, i = c.step.before[k].dim();
  const auto g = static_cast<std::size_t>(c.plan.src().mesh().size(k));
  GatherWay w;
  if (c.even || c.step.padded) {
    w.piece = padded_shape(c, c.have.shape, i, c.want.shape[i]);
    w.piece_bytes = bytes_of(Box{Shape(w.piece.size(), 0), w.piece}, c.elem);
    w.whole = w.piece == c.have.shape;
    // Zero-copy: receive straight into the target when every member's piece is whole (even)
    // and they stack as slabs of it, or, on a link that receives strided pieces, lie side by
    // side in it.
    w.direct = c.even && slabs_along(c.want.shape, i);
    w.strided = a.strided_all_gather && c.even && !w.direct;
    w.send = w.whole ? 0 : w.piece_bytes;
    w.send_zeroed = true;
    w.recv = w.direct || w.strided ? 0 : w.piece_bytes * g;
    w.use_spare(c.spare_bytes);
    return w;
  }
  // Exact: every member's block, whatever its size, in one point-to-point round; straight into
  // the target where the blocks are slabs of it, or, on a link that moves strided messages,
  // where every block lies in it as runs of one stride (`strided`).
  w.direct = slabs_along(c.want.shape, i);
  w.strided = !w.direct && a.strided_exchange;
  for (int j = 0; j < static_cast<int>(g) && w.strided; ++j)
    w.strided = runs_of(member_box(c, c.before, j), c.want, c.elem).has_value();
  w.at = packed_offsets(c, [&](int j) { return member_box(c, c.before, j); });
  w.recv = w.direct || w.strided ? 0 : w.at.back();
  w.use_spare(c.spare_bytes);
  return w;
}

// Each run_* performs one step on `ops`'s memory and returns the bytes of staging it allocated
// (its *_way's send + recv). `c` and `ops` live in the caller's frame, which outlives the step.
template <class L, class Ops>
Task<std::size_t> run_all_gather(L link, const Ops& ops, const StepContext& c, const std::byte* cur,
                                 std::byte* out) {
  const int k = c.step.mesh_dim, i = c.step.before[k].dim();
  const int g = c.plan.src().mesh().size(k), me = c.me[k];
  const GatherWay w = gather_way(c, link_abilities(link));
  const Shape origin(c.have.shape.size(), 0);
  if (c.even || c.step.padded) {
    const StagingBuffers b(ops, w, c.spare);
    if (!w.whole)
      ops.copy_box(cur, c.have.shape, origin, b.send, w.piece, origin, c.have.shape, c.elem);
    const std::byte* const from = w.whole ? cur : b.send;
    if constexpr (StridedGatherLink<L>) {
      if (w.strided)
        co_await link.all_gather_strided(k, from, out, pieces_along(c.want.shape, i, g, c.elem));
    }
    if (!w.strided) co_await link.all_gather(k, from, w.direct ? out : b.recv, w.piece_bytes);
    if (c.even && !w.direct && !w.strided)
      ops.unpack_pieces(b.recv, out, c.want.shape, i, g, c.elem);
    for (int j = 0; j < g && !c.even; ++j) {
      const Box bj = member_box(c, c.before, j);
      ops.copy_box(b.recv + static_cast<std::size_t>(j) * w.piece_bytes, w.piece, origin, out,
                   c.want.shape, relative(bj, c.want), bj.shape, c.elem);
    }
    co_return b.allocated();
  }
  const StagingBuffers b(ops, w, c.spare);
  Messages m;
  for (int j = 0; j < g; ++j) {
    if (j == me) continue;
    const auto u = static_cast<std::size_t>(j);
    if (!c.have.empty()) m.send(global_rank(c, j), cur, bytes_of(c.have, c.elem));
    if (w.at[u + 1] == w.at[u]) continue;
    const Box bj = member_box(c, c.before, j);
    if (w.strided) {
      const PieceRuns r = *runs_of(bj, c.want, c.elem);
      m.recv(global_rank(c, j), out + r.offset, r.runs);
    } else {
      m.recv(global_rank(c, j), w.direct ? out + slab_offset(bj, c.want, c.elem) : b.recv + w.at[u],
             w.at[u + 1] - w.at[u]);
    }
  }
  co_await send_and_receive(link, m);
  for (int j = 0; j < g; ++j) {
    if ((w.direct || w.strided) && j != me) continue;
    const Box bj = member_box(c, c.before, j);
    const std::byte* from = j == me ? cur : b.recv + w.at[static_cast<std::size_t>(j)];
    copy_piece(ops, from, bj, out, c.want, bj, c.elem);
  }
  co_return b.allocated();
}

// Whether the pieces step s scatters are slabs of every rank's block (slabs_along): every
// tensor dim before the scattered one has extent 1 in the global shape.
inline bool slabs_everywhere(const Plan& plan, const Step& s) {
  const int j_dim = s.after[s.mesh_dim].dim();
  for (int d = 0; d < j_dim; ++d)
    if (plan.src().global_shape()[d] > 1) return false;
  return true;
}

// Whether a reduce-scatter runs as one point-to-point round (run_exchange_reduce) rather than
// the native collective: its pieces are uneven and unpadded, or, on a link that moves strided
// messages, they need not be slabs of the block (a tensor dim before the scattered one is
// longer than 1), so that they go where they lie instead of packed (the native collective
// packs the block, the round stages the partials of all but this member's piece), or its blocks
// are at least the backend's reduce_messages_bytes. The choice is the same on every
// rank: it reads only the step, the global shape and the first rank's block.
// (`even`: the step's, step_is_even.)
inline bool scatters_by_messages(const Plan& plan, const Step& step, bool even, LinkAbilities a) {
  if (step.padded) return false;
  if (!even) return true;
  if (reduces_at_least(plan, step, a.reduce_messages_from)) return true;
  return a.strided_exchange && !slabs_everywhere(plan, step);
}
inline bool scatters_by_messages(const StepContext& c, LinkAbilities a) {
  return scatters_by_messages(c.plan, c.step, c.even, a);
}

// Whether the result of reducing with `op` does not depend on the order its parts combine in
// (max and min: the result is one of the parts; of several NaNs, the first met is kept).
constexpr bool combines_in_any_order(ReduceOp op) noexcept {
  return op == ReduceOp::max || op == ReduceOp::min;
}

// Whether parts of `dtype` reduced with `op` may be folded into the target one at a time, the
// running result stored in the target between parts, with the same bits as reducing them all at
// once in that order: max and min, or a sum or a product where the arithmetic happens in the
// type itself (not f16 or bf16, which accumulate in float and would round at every part; not
// avg, which divides once at the end).
constexpr bool folds_one_at_a_time(ReduceOp op, DType dtype) noexcept {
  if (combines_in_any_order(op)) return true;
  return (op == ReduceOp::sum || op == ReduceOp::product) && dtype != DType::f16 &&
         dtype != DType::bf16;
}

// Whether a reduce-scatter step of `plan` as one point-to-point round would take some rank past
// the larger of its source and target blocks. Its pieces sent from where they lie, it stages the
// g - 2 partials of the rank's piece it receives (its own is reduced from the block, one other is
// received into the target); packed (`packs`), the other members' pieces and at most g - 1
// partials (g - 2 where its own folds through those pieces after the round,
// ExchangeReduceWay::own_in_bands; counted as g - 1). Beside them, the block it reads and the one
// it writes, counted as scratch unless the step reads the caller's source (the plan's first) or
// writes its target (the plan's last). The origin speaks for every rank where the step is even;
// otherwise each rank is asked.
inline bool one_round_passes_bound(const Plan& plan, const Step& step, bool even,
                                   bool packs = false) {
  const Layout& base = plan.src();
  const DeviceMesh& mesh = base.mesh();
  const std::int64_t g = mesh.size(step.mesh_dim);
  const bool first = step.before == base.placements(), last = step.after == plan.dst().placements();
  for (int r = 0; r < (even ? 1 : mesh.size()); ++r) {
    const MeshCoord c = mesh.coordinate_at(r);
    const std::int64_t want = base.local_box(step.after, c).numel();
    const std::int64_t have = base.local_box(step.before, c).numel();
    const std::int64_t ends = std::max(base.local_box(c).numel(), plan.dst().local_box(c).numel());
    const std::int64_t staged = packs ? (have - want) + (g - 1) * want : (g - 2) * want;
    if (staged + (first ? 0 : have) + (last ? 0 : want) > ends) return true;
  }
  return false;
}

// Whether a reduce-scatter's rounds (reduces_in_rounds) pack their pieces, one per round, each
// partial folded into the target as it comes: on a link without strided messages, whose pieces
// are not slabs of every block, and where the parts fold one at a time (folds_one_at_a_time).
inline bool packs_in_rounds(const Plan& plan, const Step& step, LinkAbilities a) {
  return !a.strided_exchange && !slabs_everywhere(plan, step) &&
         folds_one_at_a_time(step.before[step.mesh_dim].reduce_op(), plan.src().dtype());
}

// Whether a reduce-scatter run as point-to-point messages (run_exchange_reduce) runs as g - 1
// rounds of one message each way instead of one round (on a bounded plan, Plan::memory_bounded): in
// round s each member sends member me+s its partial of that member's piece and receives member
// me-s's partial of its own. A member whose block it may overwrite (StepContext::block_writable)
// receives the first into its target and each later one into the slot of the piece it sent the
// round before, so that it stages nothing where one round stages g - 2 partials. For even pieces (a
// slot holds a piece), or uneven ones whose parts fold one at a time (folds_one_at_a_time: the
// member copies its own partial into the target, receives each other one into its own piece's slot
// and reduces it into the target after each round; every member combines its parts in the order of
// the rounds, its own, member me-1's, me-2's, ...), sent from where they lie (a link with
// strided messages, or slabs of every block), at least 3 members, on a link that may take
// several calls for a step (not a batch's round), and only where they spare something: not the
// plan's first step (its block is the caller's source, which no round may write, so rounds would
// stage what one round does), and only where one round would take some rank past the larger of
// its blocks (one_round_passes_bound). On a link that packs pieces that are not slabs
// (packs_in_rounds), where the parts fold one at a time, each round packs one piece and receives
// one partial, folded into the target after the round (every member in round order): first
// steps included, since one round packs the whole block. Every rank decides alike, from the
// step, the options and the global shape: the rounds meet the mesh.
// (`is_even()`: whether the step is even, step_is_even; asked only past the cheaper tests.)
template <class IsEven>
bool reduces_in_rounds(const Plan& plan, const Step& step, LinkAbilities a, IsEven&& is_even) {
  if (!plan.memory_bounded() || a.one_call_per_step || step.kind != StepKind::reduce_scatter ||
      plan.src().mesh().size(step.mesh_dim) < 3)
    return false;
  const bool packs = packs_in_rounds(plan, step, a);
  if (!packs && (step.before == plan.src().placements() ||
                 !(a.strided_exchange || slabs_everywhere(plan, step))))
    return false;
  const bool even = is_even();
  return (even ||
          folds_one_at_a_time(step.before[step.mesh_dim].reduce_op(), plan.src().dtype())) &&
         scatters_by_messages(plan, step, even, a) &&
         one_round_passes_bound(plan, step, even, packs);
}
inline bool reduces_in_rounds(const StepContext& c, LinkAbilities a) {
  return !c.messages && reduces_in_rounds(c.plan, c.step, a, [&c] { return c.even; });
}

// The members of each group of an exchange from a Partial (reduce_exchange.hpp) whose first
// round, on a bounded plan, runs as one round per member instead (0 where it does not): in
// round t member t sends every other member its partial of that member's part and each other
// member receives it into one slot and folds it into its reduced part, so that the parts
// combine in group order, as in one round, and a member stages two parts (the reduced one and
// the slot) where one round stages g - 1. For groups of 3 or more, parts that fold one at a
// time (folds_one_at_a_time), a group's block cut along a tensor dim (not Step::by_elements,
// which Memory::bounded does not plan), on a link that may take several calls for a step.
// Every rank decides alike: the rounds meet the mesh.
inline int reduces_parts_in_rounds(const Plan& plan, const Step& step, LinkAbilities a) {
  if (!plan.memory_bounded() || a.one_call_per_step || step.kind != StepKind::exchange ||
      step.by_elements)
    return 0;
  const ReducedPartials r = reduced_partials(step.before, step.after);
  if (r.dims == 0 || !folds_one_at_a_time(r.op, plan.src().dtype())) return 0;
  const int g = group_size(plan.src().mesh(), r.dims);
  return g >= 3 ? g : 0;
}

inline std::vector<int> exchange_shifts(const Plan& plan, const Step& step, LinkAbilities a);
inline int exchange_bands(const Plan& plan, const Step& step, LinkAbilities a);
inline std::vector<int> delivery_shifts(const StepContext& c, LinkAbilities a);
inline int delivery_bands(const StepContext& c, LinkAbilities a);
inline StepContext context_at(const Plan& plan, const Step& step, const MeshCoord& me);
inline bool all_to_all_by_peers(const Plan& plan, const Step& step, LinkAbilities a);

// The operations a plan starts on a link with abilities `a`: one per communication step, two
// for an exchange from a Partial (its parts reduced, then delivered; g + 1 where it reduces in
// rounds, reduces_parts_in_rounds) and for an all-reduce by messages (all_reduces_by_messages:
// a reduce-scatter then an all-gather), g - 1 for a reduce-scatter in rounds
// (reduces_in_rounds) and for an all-to-all by peers (all_to_all_by_peers), one per shift for an
// exchange or a delivery in rounds (exchange_shifts, delivery_shifts), times its bands
// (exchange_bands, delivery_bands).
inline int link_operations(const Plan& plan, LinkAbilities a) {
  int n = 0;
  for (const Step& s : plan) {
    if (!moves_data(s.kind)) continue;
    if (s.kind == StepKind::exchange && exchange_reduces(s.before, s.after)) {
      const int parts = reduces_parts_in_rounds(plan, s, a);
      const MeshCoord origin(static_cast<std::size_t>(plan.src().mesh().ndim()), 0);
      const StepContext c = context_at(plan, s, origin);
      const auto shifts = static_cast<int>(delivery_shifts(c, a).size());
      n += (parts > 0 ? parts : 1) + (shifts > 0 ? shifts * delivery_bands(c, a) : 1);
    } else if (const std::size_t shifts = exchange_shifts(plan, s, a).size(); shifts > 0)
      n += static_cast<int>(shifts) * exchange_bands(plan, s, a);
    else if (s.kind == StepKind::all_reduce && reduces_at_least(plan, s, a.reduce_messages_from))
      n += 2;
    else if (reduces_in_rounds(plan, s, a, [&] { return step_is_even(plan, s); }) ||
             all_to_all_by_peers(plan, s, a))
      n += plan.src().mesh().size(s.mesh_dim) - 1;
    else
      n += 1;
  }
  return n;
}

// A reduction as one point-to-point round (run_exchange_reduce): where its pieces go, and its
// staging, the pieces packed to send and the partials received. Where `slabs`, the pieces are
// slabs of the block: sent as they lie, and this member's own partial is reduced from the block.
// Where the pieces are not slabs, a link that moves strided messages sends them from the
// block as they lie (`strided`) when every one, this member's own included, is runs of one
// stride, and the own partial is reduced from the block too, run by run.
// One partial lies in the target itself (the reduction reads every part of an element before it
// writes it): the first other member's, received there, where the own partial is reduced from
// the block; otherwise this member's own, copied there.
struct ExchangeReduceWay : Staging {
  bool slabs = false;
  bool strided = false;
  bool own_in_place = false;    // the own partial reduced from the block (slabs, or strided runs)
  bool rounds = false;          // g - 1 rounds of one message each way (reduces_in_rounds)
  bool into_slots = false;      // the partials received into the block's slots: no staging
  bool rotated = false;         // rounds with uneven pieces: parts combine in round order
  bool accumulates = false;     // into_slots and rotated: each part reduced after its round
  bool packs = false;           // rounds packing one piece each, this member's not in place
                                // (packs_in_rounds): each partial received into the staging
                                // and reduced into the target after its round
  PieceRuns own_runs;           // where the own partial lies in the block (strided, in place)
  std::vector<std::size_t> at;  // where each member's piece is packed (unless slabs or strided)
  // In one round with packed pieces, the own partial takes no slot: after the round it is
  // copied `band_rows` rows of its piece at a time into the send staging, dead by then, and
  // each band reduced from there (on a bounded plan wherever that staging holds a row of the
  // piece, else only where it holds the whole piece).
  bool own_in_bands = false;
  std::int64_t band_rows = 0;
};

template <class Piece>
ExchangeReduceWay exchange_reduce_way(const StepContext& c, bool slabs, Piece piece_of,
                                      LinkAbilities a) {
  const int members = c.plan.src().mesh().size(c.step.mesh_dim);
  const auto g = static_cast<std::size_t>(members);
  ExchangeReduceWay w;
  w.slabs = slabs;
  w.strided = !slabs && a.strided_exchange;
  for (int j = 0; j < members && w.strided; ++j)
    w.strided = j == c.me[c.step.mesh_dim] || runs_of(piece_of(j), c.have, c.elem).has_value();
  w.own_in_place = slabs;
  if (w.strided) {
    const std::optional<PieceRuns> own = runs_of(piece_of(c.me[c.step.mesh_dim]), c.have, c.elem);
    w.own_in_place = own.has_value();
    if (own) w.own_runs = *own;
  }
  w.rounds = reduces_in_rounds(c, a);
  const bool packed_rounds = w.rounds && packs_in_rounds(c.plan, c.step, a);
  w.into_slots = w.rounds && c.block_writable && w.own_in_place && (slabs || w.strided);
  w.packs = packed_rounds && !slabs && !w.strided;
  // Packed rounds fold in round order on every member, even or not.
  w.rotated = w.rounds && (!c.even || packed_rounds);
  w.accumulates = w.into_slots && w.rotated;
  w.at = packed_offsets(c, piece_of);
  w.send = slabs || w.strided ? 0 : w.at.back();
  w.recv = w.into_slots ? 0 : bytes_of(c.want, c.elem) * (w.own_in_place ? g - 2 : g - 1);
  if (w.packs) {  // one piece packed, one partial received at a time
    w.send = 0;
    for (std::size_t j = 0; j < g; ++j) w.send = std::max(w.send, w.at[j + 1] - w.at[j]);
    w.recv = bytes_of(c.want, c.elem);
  }
  // The own partial folded in bands through the packed pieces' staging after the round, where
  // it would take a slot of its own (one round, packed pieces): as many bands as that staging
  // needs on a bounded plan, else only where one band holds the whole piece.
  if (!w.rounds && !slabs && !w.strided && !w.own_in_place && g >= 2 && !c.want.empty()) {
    const std::int64_t rows = c.want.shape[0];
    const std::size_t own = bytes_of(c.want, c.elem);
    const auto fit = static_cast<std::int64_t>(w.send / (own / static_cast<std::size_t>(rows)));
    if (fit >= (c.plan.memory_bounded() ? 1 : rows)) {
      w.own_in_bands = true;
      w.band_rows = std::min(fit, rows);
      w.recv -= own;
    }
  }
  w.use_spare(c.spare_bytes);
  return w;
}

// out = the reduction, in order, of the contiguous `parts` but part u, which lies as `runs` at
// `at` (each run one row of the contiguous parts): in one call where the ops take a strided part,
// else one run at a time.
template <class Ops>
void reduce_with_runs(const Ops& ops, DType dtype, std::byte* out,
                      const std::vector<const void*>& parts, std::size_t u, const std::byte* at,
                      const StridedPieces& r, std::size_t elem, ReduceOp op) {
  if constexpr (requires {
                  ops.reduce_with_strided_part(dtype, out, parts, u, at, r.rows, r.run_bytes,
                                               r.stride_bytes, op);
                }) {
    ops.reduce_with_strided_part(dtype, out, parts, u, at, r.rows, r.run_bytes, r.stride_bytes, op);
  } else {
    std::vector<const void*> run_parts(parts.size());
    for (std::size_t row = 0; row < r.rows; ++row) {
      for (std::size_t j = 0; j < parts.size(); ++j)
        run_parts[j] = j == u ? at + row * r.stride_bytes
                              : static_cast<const std::byte*>(parts[j]) + row * r.run_bytes;
      ops.reduce(dtype, out + row * r.run_bytes, run_parts, r.run_bytes / elem, op);
    }
  }
}

// out = the reduction, in order, of `parts` (each laid out as the box `piece`), part `own` read
// from this rank's block `cur` (box `have`): copied into `band` `band_rows` rows of `piece` at a
// time, each band reduced from there.
template <class Ops>
void reduce_own_in_bands(const Ops& ops, DType dtype, std::byte* out,
                         const std::vector<const void*>& parts, std::size_t own,
                         const std::byte* cur, const Box& have, const Box& piece, std::byte* band,
                         std::int64_t band_rows, std::size_t elem, ReduceOp op) {
  const std::int64_t rows = piece.shape[0];
  const std::size_t row_bytes = bytes_of(piece, elem) / static_cast<std::size_t>(rows);
  std::vector<const void*> at_band(parts.size());
  for (std::int64_t r = 0; r < rows; r += band_rows) {
    Box b = piece;
    b.offset[0] += r;
    b.shape[0] = std::min(band_rows, rows - r);
    copy_piece(ops, cur, have, band, b, b, elem);
    const std::size_t at = static_cast<std::size_t>(r) * row_bytes;
    for (std::size_t j = 0; j < parts.size(); ++j)
      at_band[j] = j == own ? band : static_cast<const std::byte*>(parts[j]) + at;
    ops.reduce(dtype, out + at, at_band, bytes_of(b, elem) / elem, op);
  }
}

// out = the reduction, in order, of `parts`, each one run per row of `runs`: part j at
// parts[j] + row * runs.stride_bytes where strided[j], else contiguous (each run one row).
template <class Ops>
void reduce_rows(const Ops& ops, DType dtype, std::byte* out, const std::vector<const void*>& parts,
                 const std::vector<bool>& strided, const StridedPieces& runs, std::size_t elem,
                 ReduceOp op) {
  std::vector<const void*> row_parts(parts.size());
  for (std::size_t row = 0; row < runs.rows; ++row) {
    for (std::size_t j = 0; j < parts.size(); ++j)
      row_parts[j] = static_cast<const std::byte*>(parts[j]) +
                     row * (strided[j] ? runs.stride_bytes : runs.run_bytes);
    ops.reduce(dtype, out + row * runs.run_bytes, row_parts, runs.run_bytes / elem, op);
  }
}

// Each member sends every other member its partial of that member's piece (`piece_of(j)`,
// inside the block), then reduces the g partials of its own piece (c.want) in group order, so
// that members with the same piece compute bit-identical values. In one round, or in g - 1
// (reduces_in_rounds), where a writable block takes the partials in the slots already sent;
// with uneven pieces (folds_one_at_a_time) each partial in turn in the own piece's slot, reduced
// into the target after its round, and the parts combine in round order (own, me-1, me-2, ...)
// whether the block is writable or not, so members with the same piece still combine alike.
template <class L, class Ops, class Piece>
Task<std::size_t> run_exchange_reduce(L link, const Ops& ops, const StepContext& c,
                                      const std::byte* cur, std::byte* out, bool slabs,
                                      Piece piece_of) {
  const int k = c.step.mesh_dim;
  const int g = c.plan.src().mesh().size(k), me = c.me[k];
  const std::size_t own_bytes = bytes_of(c.want, c.elem);
  const ExchangeReduceWay w = exchange_reduce_way(c, slabs, piece_of, link_abilities(link));
  const StagingBuffers b(ops, w, c.spare);
  // Per member j: its message (this member's partial of j's piece) and where j's partial of this
  // member's piece is received; parts[j] where the reduction reads it.
  std::vector<Messages> to(static_cast<std::size_t>(g));
  std::vector<const void*> parts(static_cast<std::size_t>(g));
  std::vector<bool> strided_part(static_cast<std::size_t>(g), false);
  auto member = [g, me](int s) { return ((me + s) % g + g) % g; };
  // The slot of member j's piece in the block, as runs (into_slots; the block is ours).
  auto slot = [&](int j) {
    if (slabs) {
      const std::size_t at = slab_offset(piece_of(j), c.have, c.elem);
      return PieceRuns{at, {1, own_bytes, own_bytes}};
    }
    return *runs_of(piece_of(j), c.have, c.elem);
  };
  std::size_t next = 0;  // partials staged so far; the first lies in the target (`out`)
  // accumulates: where each other member's partial is received, the own piece's slot.
  PieceRuns own_slot{};
  std::byte* own_at = nullptr;
  if (w.accumulates && own_bytes) {
    own_slot = slot(me);
    // The block is scratch or the caller's target (block_writable), never the source.
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast)
    own_at = const_cast<std::byte*>(cur) + own_slot.offset;
  }
  for (int j = 0; j < g; ++j) {
    const auto u = static_cast<std::size_t>(j);
    Messages& m = to[u];
    if (w.packs) {  // own copied into the target; each other partial into the staging
      if (j == me) {
        if (own_bytes) copy_piece(ops, cur, c.have, out, c.want, c.want, c.elem);
      } else if (own_bytes) {
        m.recv(global_rank(c, j), b.recv, own_bytes);
      }
      continue;  // packed and sent in its round
    }
    if (w.accumulates) {
      if (j == me) {  // the first part, copied into the target before its slot is reused
        if (own_bytes) copy_piece(ops, cur, c.have, out, c.want, c.want, c.elem);
        continue;
      }
      if (own_bytes) m.recv(global_rank(c, j), own_at, own_slot.runs);
    } else if (j == me && slabs) {
      parts[u] = cur + slab_offset(c.want, c.have, c.elem);
      continue;
    } else if (j == me && w.own_in_place) {  // reduced from the block, run by run
      parts[u] = cur + w.own_runs.offset;
      strided_part[u] = true;
      continue;
    } else if (j != me && w.into_slots) {
      // From member me-1 into the target; from member me-s (s >= 2) into the slot of the piece
      // sent in round s-1, member me+s-1's.
      const int s = ((me - j) % g + g) % g;  // j = me - s
      if (s == 1) {
        parts[u] = out;
        if (own_bytes) m.recv(global_rank(c, j), out, own_bytes);
      } else {
        const PieceRuns r = slot(member(s - 1));
        // The block is scratch or the caller's target (block_writable), never the source.
        // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast)
        auto* at = const_cast<std::byte*>(cur) + r.offset;
        parts[u] = at;
        strided_part[u] = !slabs;
        if (own_bytes) m.recv(global_rank(c, j), at, r.runs);
      }
    } else if (j == me && w.own_in_bands) {
      continue;  // folded after the round, a band at a time
    } else {
      std::byte* partial = next++ == 0 ? out : b.recv + (next - 2) * own_bytes;
      parts[u] = partial;
      if (j == me) {
        copy_piece(ops, cur, c.have, partial, c.want, c.want, c.elem);
        continue;
      }
      if (own_bytes) m.recv(global_rank(c, j), partial, own_bytes);
    }
    const Box aj = piece_of(j);
    if (aj.empty()) {
    } else if (w.strided) {
      const PieceRuns r = *runs_of(aj, c.have, c.elem);
      m.send(global_rank(c, j), cur + r.offset, r.runs);
    } else if (slabs) {
      m.send(global_rank(c, j), cur + slab_offset(aj, c.have, c.elem), w.at[u + 1] - w.at[u]);
    } else {
      copy_piece(ops, cur, c.have, b.send + w.at[u], aj, aj, c.elem);
      m.send(global_rank(c, j), b.send + w.at[u], w.at[u + 1] - w.at[u]);
    }
  }
  const DType dtype = c.plan.src().dtype();
  const ReduceOp op = c.step.before[k].reduce_op();
  if (w.rounds) {
    // Round s: the message to member me+s, the partial from member me-s.
    for (int s = 1; s < g; ++s) {
      Messages round;
      const Messages& out_to = to[static_cast<std::size_t>(member(s))];
      const Messages& in_from = to[static_cast<std::size_t>(member(-s))];
      round.sends = out_to.sends;
      round.recvs = in_from.recvs;
      if (w.packs) {
        const auto u = static_cast<std::size_t>(member(s));
        if (const Box aj = piece_of(member(s)); !aj.empty()) {
          copy_piece(ops, cur, c.have, b.send, aj, aj, c.elem);
          round.send(global_rank(c, member(s)), b.send, w.at[u + 1] - w.at[u]);
        }
      }
      co_await send_and_receive(link, round);
      if (w.packs && own_bytes) {
        const std::vector<const void*> both{out, b.recv};
        ops.reduce(dtype, out, both, static_cast<std::size_t>(c.want.numel()), op);
        continue;
      }
      if (!w.accumulates || !own_bytes) continue;
      const std::vector<const void*> both{out, own_at};
      if (slabs)
        ops.reduce(dtype, out, both, static_cast<std::size_t>(c.want.numel()), op);
      else
        reduce_with_runs(ops, dtype, out, both, 1, own_at, own_slot.runs, c.elem, op);
    }
  } else {
    Messages all;
    for (const Messages& m : to) {
      all.sends.insert(all.sends.end(), m.sends.begin(), m.sends.end());
      all.recvs.insert(all.recvs.end(), m.recvs.begin(), m.recvs.end());
    }
    co_await send_and_receive(link, all);
  }
  if (own_bytes == 0 || w.accumulates || w.packs) co_return b.allocated();
  auto own_part = static_cast<std::size_t>(me);
  if (w.own_in_bands) {  // parts in group order, the own one a band at a time in `b.send`
    reduce_own_in_bands(ops, dtype, out, parts, own_part, cur, c.have, c.want, b.send, w.band_rows,
                        c.elem, op);
    co_return b.allocated();
  }
  if (w.rotated) {  // round order: part p is member me-p's
    const std::vector<const void*> by_member = parts;
    const std::vector<bool> strided_by_member = strided_part;
    for (int p = 0; p < g; ++p) {
      const auto from = static_cast<std::size_t>(member(-p));
      parts[static_cast<std::size_t>(p)] = by_member[from];
      strided_part[static_cast<std::size_t>(p)] = strided_by_member[from];
    }
    own_part = 0;
  }
  if (w.into_slots && !slabs) {
    reduce_rows(ops, dtype, out, parts, strided_part, w.own_runs.runs, c.elem, op);
  } else if (slabs || !w.own_in_place) {
    ops.reduce(dtype, out, parts, static_cast<std::size_t>(c.want.numel()), op);
  } else {
    reduce_with_runs(ops, dtype, out, parts, own_part, cur + w.own_runs.offset, w.own_runs.runs,
                     c.elem, op);
  }
  co_return b.allocated();
}

// How a native reduce-scatter moves its pieces on this rank, and the staging that takes.
struct ScatterWay : Staging {
  Shape piece;  // every member's piece, padded to the largest
  std::size_t piece_bytes = 0;
  bool whole = false;        // this member's piece needs no padding: received in the target
  bool direct_send = false;  // the block's pieces are slabs of it: sent as it lies
  // Even over a pair, on a bounded plan, where the block may be overwritten (block_writable),
  // is not cut in bands and its pieces are not slabs of it, and packing them would stage
  // something: the two pieces are put one after the other in the block itself
  // (pack_pair_in_block, with the target as room for one of them) and sent from there.
  bool pack_in_block = false;
};

inline ScatterWay scatter_way(const StepContext& c) {
  const int k = c.step.mesh_dim, j_dim = c.step.after[k].dim();
  const auto g = static_cast<std::size_t>(c.plan.src().mesh().size(k));
  ScatterWay w;
  w.piece = padded_shape(c, c.want.shape, j_dim, c.have.shape[j_dim]);
  w.piece_bytes = bytes_of(Box{Shape(w.piece.size(), 0), w.piece}, c.elem);
  w.whole = w.piece == c.want.shape;
  w.direct_send = c.even && slabs_along(c.have.shape, j_dim);
  w.send = w.direct_send ? 0 : w.piece_bytes * g;
  w.send_zeroed = !w.whole;
  w.recv = w.whole ? 0 : w.piece_bytes;
  w.use_spare(c.spare_bytes);
  if (c.even && !w.direct_send && g == 2 && c.block_writable && !c.banded &&
      c.plan.memory_bounded() && w.allocated() > 0) {
    w.pack_in_block = true;
    w.send = 0;
    w.send_spare = false;
  }
  return w;
}

// Puts the two equal pieces of a row-major block of `shape` along dim d, which are not slabs of
// it, one after the other in the block itself, as pack_pieces would elsewhere, with `room` (a
// piece's bytes, not overlapping the block) to hold piece 1 meanwhile: piece 1 copied to room,
// piece 0 moved to the front in batches of rows, each batch after the one before and to a place
// its rows do not read (rows [a, 2a) go where rows [a/2, a) of the block were, already moved),
// then piece 1 copied back behind it. One copy per doubling of the rows, each within itself
// disjoint, in order.
template <class Ops>
void pack_pair_in_block(const Ops& ops, std::byte* block, const Shape& shape, int d,
                        std::byte* room, std::size_t elem) {
  const StridedPieces p = pieces_along(shape, d, 2, elem);
  const auto rows = static_cast<std::int64_t>(p.rows);
  const auto run = static_cast<std::int64_t>(p.run_bytes / elem);  // elements of a run
  const Shape pairs{rows, 2 * run}, singles{rows, run};
  ops.copy_box(block, pairs, Shape{0, run}, room, singles, Shape{0, 0}, singles, elem);
  for (std::int64_t a = 1; a < rows; a *= 2) {
    const std::int64_t n = std::min(a, rows - a);
    ops.copy_box(block, pairs, Shape{a, 0}, block, singles, Shape{a, 0}, Shape{n, run}, elem);
  }
  ops.copy(block + p.rows * p.run_bytes, room, p.rows * p.run_bytes);
}

template <class L, class Ops>
Task<std::size_t> run_reduce_scatter(L link, const Ops& ops, const StepContext& c,
                                     const std::byte* cur, std::byte* out) {
  const int k = c.step.mesh_dim, j_dim = c.step.after[k].dim();
  const int g = c.plan.src().mesh().size(k);
  const ReduceOp op = c.step.before[k].reduce_op();
  const DType dtype = c.plan.src().dtype();
  const Shape origin(c.want.shape.size(), 0);
  if (!scatters_by_messages(c, link_abilities(link))) {
    const ScatterWay w = scatter_way(c);
    const StagingBuffers b(ops, w, c.spare);
    if (w.pack_in_block)
      // The block is scratch or the caller's target (block_writable), never the source; the
      // target holds piece 1 until the block is packed.
      // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast)
      pack_pair_in_block(ops, const_cast<std::byte*>(cur), c.have.shape, j_dim, out, c.elem);
    else if (c.even && !w.direct_send)
      ops.pack_pieces(cur, c.have.shape, j_dim, g, b.send, c.elem);
    for (int j = 0; j < g && !c.even; ++j) {
      const Box aj = member_box(c, c.after, j);
      ops.copy_box(cur, c.have.shape, relative(aj, c.have),
                   b.send + static_cast<std::size_t>(j) * w.piece_bytes, w.piece, origin, aj.shape,
                   c.elem);
    }
    co_await link.reduce_scatter(k, w.direct_send || w.pack_in_block ? cur : b.send,
                                 w.whole ? out : b.recv,
                                 static_cast<std::size_t>(Box{origin, w.piece}.numel()), dtype, op);
    if (!w.whole)
      ops.copy_box(b.recv, w.piece, origin, out, c.want.shape, origin, c.want.shape, c.elem);
    co_return b.allocated();
  }
  // Exact: one point-to-point round (run_exchange_reduce).
  co_return co_await run_exchange_reduce(link, ops, c, cur, out, slabs_along(c.have.shape, j_dim),
                                         [&c](int j) { return member_box(c, c.after, j); });
}

// How an all-to-all moves its pieces on this rank, and the staging that takes.
struct AllToAllWay : Staging {
  Shape piece;                  // native: every piece, padded to the largest
  std::size_t piece_bytes = 0;  // native
  bool direct_send = false;     // the pieces are slabs of the block: sent as they lie
  bool strided_send = false;    // sent strided from the block (native: StridedLink; exact:
                                // StridedExchangeLink)
  bool direct_recv = false;     // the pieces are slabs of the target: received there
  bool strided_recv = false;    // received strided into the target (as strided_send)
  // Native, even, packed and staged on both sides: the pieces are packed into the target (of
  // the same size), which nothing else uses until the received pieces are unpacked into it.
  bool pack_in_target = false;
  // By peers (all_to_all_by_peers): g - 1 point-to-point rounds of one piece each way; with
  // `into_slots`, each piece received into the own piece's slab of the block (copied out first)
  // and unpacked from there.
  bool by_peers = false;
  bool into_slots = false;
  // By peers, the pieces slabs of the target but not of the block: each piece sent is packed into
  // the own piece's slab of the target, which is copied there after the rounds.
  bool send_in_own_slab = false;
  // Exact: the member whose piece is received into the own piece's slab of the block (-1: none).
  int into_own_slab = -1;
  std::vector<std::size_t> send_at, recv_at;  // exact: where the pieces are packed and staged
};

// With `in_place`, the target is the block itself (an even step): the pieces are packed out of
// it first, and received into it. In one call (one round where exact), never by peers.
inline AllToAllWay all_to_all_way_in_one_call(const StepContext& c, LinkAbilities a,
                                              bool in_place = false) {
  const int k = c.step.mesh_dim;
  const int i = c.step.before[k].dim(), j_dim = c.step.after[k].dim();
  const auto g = static_cast<std::size_t>(c.plan.src().mesh().size(k));
  AllToAllWay w;
  if (c.even || c.step.padded) {
    w.piece = padded_shape(c, c.have.shape, i, c.want.shape[i]);
    w.piece = padded_shape(c, w.piece, j_dim, c.have.shape[j_dim]);
    w.piece_bytes = bytes_of(Box{Shape(w.piece.size(), 0), w.piece}, c.elem);
    // Zero-copy where the pieces are slabs: of the block along j (send), of the target along i
    // (receive). Where they are not, a link that moves strided pieces takes them from the
    // block as they lie and puts them in the target where they go; otherwise they are packed
    // and unpacked.
    w.direct_send = c.even && !in_place && slabs_along(c.have.shape, j_dim);
    w.strided_send = a.strided_all_to_all && c.even && !in_place && !w.direct_send;
    w.direct_recv = c.even && slabs_along(c.want.shape, i);
    w.strided_recv = a.strided_all_to_all && c.even && !w.direct_recv;
    const bool packed = !w.direct_send && !w.strided_send,
               staged = !w.direct_recv && !w.strided_recv;
    w.pack_in_target = c.even && !in_place && packed && staged;
    w.send = packed && !w.pack_in_target ? w.piece_bytes * g : 0;
    w.send_zeroed = !c.even;
    w.recv = staged ? w.piece_bytes * g : 0;
    w.use_spare(c.spare_bytes);
    return w;
  }
  // Exact: what each member sends packed at its offset, what it receives staged at another;
  // sent from the block as it lies where the pieces are slabs of it, received into the target
  // where they are slabs of that.
  // Elsewhere, a link that moves strided messages takes them where they lie as runs of one
  // stride (strided_send, strided_recv) when every piece is.
  auto to = [&](int j) { return intersect(c.have, member_box(c, c.after, j)); };
  auto from = [&](int j) { return intersect(member_box(c, c.before, j), c.want); };
  w.direct_send = slabs_along(c.have.shape, j_dim);
  w.direct_recv = slabs_along(c.want.shape, i);
  w.strided_send = !w.direct_send && a.strided_exchange;
  w.strided_recv = !w.direct_recv && a.strided_exchange;
  for (int j = 0; j < static_cast<int>(g); ++j) {
    w.strided_send = w.strided_send && runs_of(to(j), c.have, c.elem).has_value();
    w.strided_recv = w.strided_recv && runs_of(from(j), c.want, c.elem).has_value();
  }
  // Where the block may be overwritten (block_writable) and its pieces are slabs of it, the own
  // piece's slab, copied out first, receives the largest piece that fits there, not staged.
  if (c.block_writable && w.direct_send && !w.direct_recv && !w.strided_recv) {
    const int me = c.me[k];
    const std::size_t room = bytes_of(to(me), c.elem);
    std::size_t largest = 0;
    for (int j = 0; j < static_cast<int>(g); ++j)
      if (const std::size_t n = bytes_of(from(j), c.elem); j != me && n > largest && n <= room) {
        largest = n;
        w.into_own_slab = j;
      }
  }
  w.send_at = packed_offsets(c, to);
  w.recv_at = packed_offsets(c, [&](int j) {
    Box staged = from(j);
    if (j == w.into_own_slab) std::fill(staged.shape.begin(), staged.shape.end(), 0);
    return staged;
  });
  w.send = w.direct_send || w.strided_send ? 0 : w.send_at.back();
  w.recv = w.direct_recv || w.strided_recv ? 0 : w.recv_at.back();
  w.use_spare(c.spare_bytes);
  return w;
}

// How an all-to-all moves its pieces on this rank: by peers where all_to_all_by_peers says (an
// even step, not in bands), one piece each way at a time, sent where it lies (a slab of the
// block) or packed into one slot (the own piece's slab of the target where the pieces are slabs
// of it, the own piece copied last), received where it goes (a slab of the target), into the own
// piece's slab of the block (which may be overwritten, its pieces slabs, the own piece copied
// out first) or into one slot; in place, every piece packed out of the block first. Otherwise
// in one call (all_to_all_way_in_one_call).
inline AllToAllWay all_to_all_way(const StepContext& c, LinkAbilities a, bool in_place = false) {
  AllToAllWay w = all_to_all_way_in_one_call(c, a, in_place);
  if (!c.even || c.banded || c.messages || !all_to_all_by_peers(c.plan, c.step, a)) return w;
  const auto g = static_cast<std::size_t>(c.plan.src().mesh().size(c.step.mesh_dim));
  w.by_peers = true;
  w.strided_send = w.strided_recv = w.pack_in_target = false;
  w.into_slots = !in_place && c.block_writable && w.direct_send && !w.direct_recv;
  w.send_in_own_slab = !in_place && !w.direct_send && w.direct_recv;
  w.send = in_place ? w.piece_bytes * g : w.direct_send || w.send_in_own_slab ? 0 : w.piece_bytes;
  w.recv = w.direct_recv || w.into_slots ? 0 : w.piece_bytes;
  w.use_spare(c.spare_bytes);
  return w;
}

// An even all-to-all by peers (AllToAllWay::by_peers): this member's own piece copied from the
// block to the target (after the rounds where its slab stages the pieces sent), then in round
// s = 1 .. g-1 member me+s's piece sent and member me-s's received, one message each way, and
// placed in the target.
template <class L, class Ops>
Task<std::size_t> run_all_to_all_by_peers(L link, const Ops& ops, const StepContext& c,
                                          const AllToAllWay& w, const std::byte* cur,
                                          std::byte* out) {
  const int k = c.step.mesh_dim;
  const int i = c.step.before[k].dim(), j_dim = c.step.after[k].dim();
  const int g = c.plan.src().mesh().size(k), me = c.me[k];
  const bool in_place = cur == out;
  const std::size_t bytes = w.piece_bytes;
  const StagingBuffers b(ops, w, c.spare);
  const Shape origin(c.have.shape.size(), 0);
  // Where member j's piece starts along dim d (of the block: j_dim; of the target: i).
  auto along = [&](int d, int j) {
    Shape at = origin;
    at[static_cast<std::size_t>(d)] = j * w.piece[static_cast<std::size_t>(d)];
    return at;
  };
  auto slab = [&](int j) { return static_cast<std::size_t>(j) * bytes; };
  if (in_place) {  // every piece packed out of the block, which the pieces received overwrite
    ops.pack_pieces(cur, c.have.shape, j_dim, g, b.send, c.elem);
    ops.copy_box(b.send + slab(me), w.piece, origin, out, c.want.shape, along(i, me), w.piece,
                 c.elem);
  }
  auto copy_own = [&] {
    ops.copy_box(cur, c.have.shape, along(j_dim, me), out, c.want.shape, along(i, me), w.piece,
                 c.elem);
  };
  if (!in_place && !w.send_in_own_slab) copy_own();
  if (bytes == 0) co_return b.allocated();
  std::byte* const send = w.send_in_own_slab ? out + slab(me) : b.send;
  for (int s = 1; s < g; ++s) {
    const int to = (me + s) % g, from = (me + g - s) % g;
    const std::byte* piece = cur + slab(to);
    if (in_place) {
      piece = b.send + slab(to);
    } else if (!w.direct_send) {
      ops.copy_box(cur, c.have.shape, along(j_dim, to), send, w.piece, origin, w.piece, c.elem);
      piece = send;
    }
    std::byte* into = b.recv;
    if (w.direct_recv)
      into = out + slab(from);
    else if (w.into_slots)
      // The block is scratch or the caller's target (block_writable), never the source.
      // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast)
      into = const_cast<std::byte*>(cur) + slab(me);
    Messages m;
    m.send(global_rank(c, to), piece, bytes);
    m.recv(global_rank(c, from), into, bytes);
    co_await send_and_receive(link, m);
    if (!w.direct_recv)
      ops.copy_box(into, w.piece, origin, out, c.want.shape, along(i, from), w.piece, c.elem);
  }
  if (w.send_in_own_slab) copy_own();
  co_return b.allocated();
}

template <class L, class Ops>
Task<std::size_t> run_all_to_all(L link, const Ops& ops, const StepContext& c, const std::byte* cur,
                                 std::byte* out) {
  const int k = c.step.mesh_dim;
  const int i = c.step.before[k].dim(), j_dim = c.step.after[k].dim();
  const int g = c.plan.src().mesh().size(k), me = c.me[k];
  const AllToAllWay w = all_to_all_way(c, link_abilities(link), cur == out);
  const Shape origin(c.have.shape.size(), 0);
  if (w.by_peers) co_return co_await run_all_to_all_by_peers(link, ops, c, w, cur, out);
  if (c.even || c.step.padded) {
    const StagingBuffers b(ops, w, c.spare);
    std::byte* const packed = w.pack_in_target ? out : b.send;
    if (c.even && !w.direct_send && !w.strided_send)
      ops.pack_pieces(cur, c.have.shape, j_dim, g, packed, c.elem);
    for (int j = 0; j < g && !c.even; ++j) {
      const Box part = intersect(c.have, member_box(c, c.after, j));
      ops.copy_box(cur, c.have.shape, relative(part, c.have),
                   b.send + static_cast<std::size_t>(j) * w.piece_bytes, w.piece, origin,
                   part.shape, c.elem);
    }
    std::byte* const to = w.direct_recv || w.strided_recv ? out : b.recv;
    if constexpr (StridedLink<L>) {
      const StridedPieces contiguous{1, w.piece_bytes, w.piece_bytes * static_cast<std::size_t>(g)};
      if (w.strided_send || w.strided_recv)
        co_await link.all_to_all_strided(
            k, w.direct_send || w.strided_send ? cur : packed, to,
            w.strided_send ? pieces_along(c.have.shape, j_dim, g, c.elem) : contiguous,
            w.strided_recv ? pieces_along(c.want.shape, i, g, c.elem) : contiguous);
    }
    if (!w.strided_send && !w.strided_recv)
      co_await link.all_to_all(k, w.direct_send ? cur : packed, to, w.piece_bytes);
    if (c.even && !w.direct_recv && !w.strided_recv)
      ops.unpack_pieces(b.recv, out, c.want.shape, i, g, c.elem);
    for (int j = 0; j < g && !c.even; ++j) {
      const Box part = intersect(member_box(c, c.before, j), c.want);
      ops.copy_box(b.recv + static_cast<std::size_t>(j) * w.piece_bytes, w.piece, origin, out,
                   c.want.shape, relative(part, c.want), part.shape, c.elem);
    }
    co_return b.allocated();
  }
  const StagingBuffers b(ops, w, c.spare);
  // into_own_slab: the block is scratch or the caller's target (block_writable), not the source.
  std::byte* const own_slab =
      w.into_own_slab < 0
          ? nullptr
          // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast)
          : const_cast<std::byte*>(cur) +
                slab_offset(intersect(c.have, member_box(c, c.after, me)), c.have, c.elem);
  Messages m;
  for (int j = 0; j < g; ++j) {
    const auto u = static_cast<std::size_t>(j);
    const Box to_j = intersect(c.have, member_box(c, c.after, j));
    if (j == me) {
      copy_piece(ops, cur, c.have, out, c.want, to_j, c.elem);
      continue;
    }
    const std::size_t send_bytes = w.send_at[u + 1] - w.send_at[u];
    if (send_bytes == 0) {
    } else if (w.strided_send) {
      const PieceRuns r = *runs_of(to_j, c.have, c.elem);
      m.send(global_rank(c, j), cur + r.offset, r.runs);
    } else if (w.direct_send) {
      m.send(global_rank(c, j), cur + slab_offset(to_j, c.have, c.elem), send_bytes);
    } else {
      copy_piece(ops, cur, c.have, b.send + w.send_at[u], to_j, to_j, c.elem);
      m.send(global_rank(c, j), b.send + w.send_at[u], send_bytes);
    }
    const Box from_j = intersect(member_box(c, c.before, j), c.want);
    if (j == w.into_own_slab) {
      m.recv(global_rank(c, j), own_slab, bytes_of(from_j, c.elem));
      continue;
    }
    const std::size_t recv_bytes = w.recv_at[u + 1] - w.recv_at[u];
    if (recv_bytes == 0) continue;
    if (w.strided_recv) {
      const PieceRuns r = *runs_of(from_j, c.want, c.elem);
      m.recv(global_rank(c, j), out + r.offset, r.runs);
    } else {
      m.recv(global_rank(c, j),
             w.direct_recv ? out + slab_offset(from_j, c.want, c.elem) : b.recv + w.recv_at[u],
             recv_bytes);
    }
  }
  co_await send_and_receive(link, m);
  for (int j = 0; j < g && !w.direct_recv && !w.strided_recv; ++j) {
    if (j == me) continue;
    const Box from_j = intersect(member_box(c, c.before, j), c.want);
    copy_piece(ops,
               j == w.into_own_slab ? own_slab : b.recv + w.recv_at[static_cast<std::size_t>(j)],
               from_j, out, c.want, from_j, c.elem);
  }
  co_return b.allocated();
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

// Whether an all-reduce runs as two point-to-point rounds (run_all_reduce_by_messages): its
// blocks are at least the backend's reduce_messages_bytes (the first rank's decides).
inline bool all_reduces_by_messages(const StepContext& c, LinkAbilities a) {
  return !c.messages && reduces_at_least(c.plan, c.step, a.reduce_messages_from);
}

// The staging of run_all_reduce_by_messages: the other members' partials of this member's slice.
inline Staging all_reduce_slices_way(const StepContext& c) {
  const int k = c.step.mesh_dim, g = c.plan.src().mesh().size(k);
  const Range own = chunk_range(c.have.numel(), g, c.me[k], ChunkPolicy::balanced);
  Staging w;
  w.recv = static_cast<std::size_t>(g - 1) * static_cast<std::size_t>(own.size) * c.elem;
  w.use_spare(c.spare_bytes);
  return w;
}

// An all-reduce of a block of `n` elements of `elem` bytes as a reduce-scatter and an
// all-gather of its g balanced slices, each one point-to-point round, on member `me` of the
// group (`rank_of(j)`: member j's global rank). The first round (`scatter`) sends member j its
// slice j of the block at `in` and receives the other members' partials of slice `me` into
// `partials` (g - 1 slots of that slice, in group order); `parts` are then the g partials of
// slice `me` in group order (this member's where it lies in `in`), which the caller reduces into
// `out` at slice `me`; the second round (`gather`) sends that slice to every other member and
// receives theirs where they go in `out`. Every member reduces its slice once, in group order,
// so all hold bit-identical values; `in` may be `out` (in place).
struct SliceRounds {
  Range own;  // this member's slice
  std::vector<const void*> parts;
  Messages scatter, gather;
};
template <class RankOf>
SliceRounds all_reduce_slice_rounds(const std::byte* in, std::byte* out, std::int64_t n, int g,
                                    int me, std::size_t elem, std::byte* partials, RankOf rank_of) {
  SliceRounds r;
  r.own = chunk_range(n, g, me, ChunkPolicy::balanced);
  const auto at = [&](const Range& x) { return static_cast<std::size_t>(x.start) * elem; };
  const auto bytes = [&](const Range& x) { return static_cast<std::size_t>(x.size) * elem; };
  r.parts.resize(static_cast<std::size_t>(g));
  std::size_t next = 0;
  for (int j = 0; j < g; ++j) {
    const auto u = static_cast<std::size_t>(j);
    if (j == me) {
      r.parts[u] = in + at(r.own);
      continue;
    }
    const Range slice = chunk_range(n, g, j, ChunkPolicy::balanced);
    std::byte* partial = partials + next++ * bytes(r.own);
    r.parts[u] = partial;
    if (slice.size != 0) r.scatter.send(rank_of(j), in + at(slice), bytes(slice));
    if (r.own.size != 0) r.scatter.recv(rank_of(j), partial, bytes(r.own));
    if (r.own.size != 0) r.gather.send(rank_of(j), out + at(r.own), bytes(r.own));
    if (slice.size != 0) r.gather.recv(rank_of(j), out + at(slice), bytes(slice));
  }
  return r;
}

// An all-reduce by all_reduce_slice_rounds: it moves what the cost model counts for an
// all-reduce, and runs in place.
template <class L, class Ops>
Task<std::size_t> run_all_reduce_by_messages(L link, const Ops& ops, const StepContext& c,
                                             const std::byte* cur, std::byte* out) {
  const int k = c.step.mesh_dim, g = c.plan.src().mesh().size(k);
  const StagingBuffers b(ops, all_reduce_slices_way(c), c.spare);
  const SliceRounds r = all_reduce_slice_rounds(cur, out, c.have.numel(), g, c.me[k], c.elem,
                                                b.recv, [&](int j) { return global_rank(c, j); });
  co_await send_and_receive(link, r.scatter);
  if (r.own.size != 0)
    ops.reduce(c.plan.src().dtype(), out + static_cast<std::size_t>(r.own.start) * c.elem, r.parts,
               static_cast<std::size_t>(r.own.size), c.step.before[k].reduce_op());
  co_await send_and_receive(link, r.gather);
  co_return b.allocated();
}

// How an exchange moves its pieces on this rank: the pieces to and from other ranks, each sent
// from the block or received into the target where it lies there (one contiguous run, or, on a
// link that moves strided messages, runs of one stride), packed or staged one after another
// otherwise; this rank's own pieces are copied. In one round, or (`rounds`, exchange_shifts)
// in one round per shift s, in which every rank sends rank me + s its pieces and receives
// those of rank me - s (in mesh order, modulo the mesh's size): the staging is then the
// largest round's, each piece staged from the start of its round's buffers.
struct ExchangeWay : Staging {
  struct Piece {
    int peer = 0;
    Box box;
    std::size_t at = 0;     // offset in the block or target (in place), else in the staging
    bool in_place = false;  // where it lies in the block (sent) or the target (received)
    StridedPieces runs;     // in place: its runs there; else one run
  };
  // One round of an exchange in rounds: the global ranks it sends to and receives from.
  struct Round {
    int to = 0, from = 0;
  };
  std::vector<Piece> outgoing, incoming;
  std::vector<Box> own;
  std::vector<Round> rounds;  // empty: one round
  // Each round in `bands` parts (exchange_bands): part k moves band k of every piece of the
  // round (exchange_band), staged from the start of the buffers; the staging is the largest
  // part's.
  int bands = 1;
  bool strided = false;  // the link moves strided messages: pieces of runs of one stride in place
  // The staging that spare room does not take lies in this rank's largest own piece that is a
  // slab of its target, or in the buffer past its target (own_room_of), `own_room_at` bytes
  // into the target (own pieces copied after the rounds).
  bool own_room = false;
  std::size_t own_room_at = 0;
};

// The piece as it moves: in place in `block` where it lies as one run or (`strided`) as runs of
// one stride; else at `staged` bytes into the staging, which it then extends.
inline ExchangeWay::Piece exchange_piece(int peer, const Box& piece, const Box& block,
                                         std::size_t elem, bool strided, std::size_t& staged) {
  const std::size_t bytes = bytes_of(piece, elem);
  if (contiguous_in(piece, block))
    return {peer, piece, slab_offset(piece, block, elem), true, {1, bytes, bytes}};
  if (strided)
    if (const std::optional<PieceRuns> r = runs_of(piece, block, elem))
      return {peer, piece, r->offset, true, r->runs};
  ExchangeWay::Piece p{peer, piece, staged, false, {1, bytes, bytes}};
  staged += bytes;
  return p;
}

// The pieces of an exchange (not from a Partial) of `plan` on the rank at `me`, in one round,
// the staging not yet placed in spare room.
inline ExchangeWay exchange_pieces(const Plan& plan, const Step& step, const MeshCoord& me,
                                   bool strided) {
  const Layout& base = plan.src();
  const DeviceMesh& mesh = base.mesh();
  const auto elem = static_cast<std::size_t>(base.elem_bytes());
  const Box have = base.local_box(step.before, me), want = base.local_box(step.after, me);
  ExchangeWay w;
  w.strided = strided;
  for_each_exchange_target(
      base, step.before, step.after, me, [&](const MeshCoord& receiver, const Box& piece) {
        if (receiver == me) return;
        w.outgoing.push_back(
            exchange_piece(mesh.rank(receiver), piece, have, elem, strided, w.send));
      });
  for_each_exchange_source(
      base, step.before, step.after, me, [&](const MeshCoord& source, const Box& piece) {
        if (source == me) {
          w.own.push_back(piece);
          return;
        }
        w.incoming.push_back(exchange_piece(mesh.rank(source), piece, want, elem, strided, w.recv));
      });
  return w;
}

// The memory bound of the rank at `c` on a step of `plan`: the larger of its source and target
// blocks (`ends`, bytes), and what the blocks the step reads and writes hold of it (`blocks`;
// the caller's source and target take none), and whether the block the step writes lies in the
// caller's target (`in_target`: the step ends the plan, or block_after_in_target).
struct StepBlocks {
  std::size_t blocks = 0, ends = 0;
  bool in_target = false;
};
inline bool local_steps_in_place(const Plan& plan, std::size_t first, std::size_t last,
                                 const MeshCoord& me);

// Whether the block after `step` of `plan` can lie in the caller's target on the rank at `c`
// over a link with abilities `a`, at its start, until the plan ends: it fits there, and every
// step after it is local and runs in place there (as place_blocks runs their stages: one
// identity or scale, a fill where the link fills in place, fused steps that move no element).
inline bool block_after_in_target(const Plan& plan, const Step& step, const MeshCoord& c,
                                  LinkAbilities a) {
  const Layout& base = plan.src();
  if (base.local_box(step.after, c).numel() > plan.dst().local_box(c).numel()) return false;
  Stage stages[max_plan_steps];
  const std::size_t n = stages_of(plan, stages);
  bool after = false;
  for (std::size_t i = 0; i < n; ++i) {
    const Stage& s = stages[i];
    if (!after) {
      after = s.first == s.last && plan[s.last].before == step.before &&
              plan[s.last].after == step.after && plan[s.last].kind == step.kind;
      continue;
    }
    if (s.first != s.last) {
      if (!local_steps_in_place(plan, s.first, s.last, c)) return false;
      continue;
    }
    const StepKind k = plan[s.last].kind;
    if (!(k == StepKind::identity || k == StepKind::scale ||
          (k == StepKind::fill && a.fills_in_place)))
      return false;
  }
  return after;
}

// With `a`, the block after `step` counts nothing where it can lie in the target
// (block_after_in_target).
inline StepBlocks step_blocks_at(const Plan& plan, const Step& step, const MeshCoord& c,
                                 const LinkAbilities* a = nullptr) {
  const Layout& base = plan.src();
  const auto elem = static_cast<std::size_t>(base.elem_bytes());
  const bool first = step.before == base.placements();
  const bool last = step.after == plan.dst().placements() ||
                    (a != nullptr && block_after_in_target(plan, step, c, *a));
  return {(first ? 0 : bytes_of(base.local_box(step.before, c), elem)) +
              (last ? 0 : bytes_of(base.local_box(step.after, c), elem)),
          std::max(bytes_of(base.local_box(c), elem), bytes_of(plan.dst().local_box(c), elem)),
          last};
}

// What one round of an exchange stages on a rank (all of it), and the pieces that rounds would
// move one shift at a time (those of the exchange, or of an exchange from a Partial's delivery).
struct OneRound {
  std::size_t staged = 0;
  ExchangeWay pieces;
};

// The shifts (ascending) of an exchange's rounds (ExchangeWay::rounds) on a bounded plan, or
// none for one round: where one round (`one_round(coord)`) would take some rank whose pieces
// stage anything past the larger of its source and target blocks, with the block it reads and
// the one it writes (in scratch unless the caller's source or target). Each shift in which some
// rank sends a piece is one round. Every rank decides alike, from every rank's round: the
// rounds meet the mesh.
template <class OneRoundAt>
std::vector<int> shifts_past_bound(const Plan& plan, const Step& step, OneRoundAt&& one_round,
                                   const LinkAbilities* a = nullptr) {
  const DeviceMesh& mesh = plan.src().mesh();
  const int ranks = mesh.size();
  bool passes = false;
  std::vector<bool> used(static_cast<std::size_t>(ranks), false);
  for (int r = 0; r < ranks; ++r) {
    const MeshCoord c = mesh.coordinate_at(r);
    const OneRound round = one_round(c);
    const StepBlocks x = step_blocks_at(plan, step, c, a);
    passes =
        passes || (round.pieces.send + round.pieces.recv > 0 && x.blocks + round.staged > x.ends);
    for (const ExchangeWay::Piece& p : round.pieces.outgoing)
      used[static_cast<std::size_t>((mesh.index_of(p.peer) - r + ranks) % ranks)] = true;
  }
  std::vector<int> shifts;
  if (passes)
    for (int s = 1; s < ranks; ++s)
      if (used[static_cast<std::size_t>(s)]) shifts.push_back(s);
  return shifts;
}

// What decides an exchange's rounds besides its plan and step (RoundShiftsMemo's key): the
// link's abilities, and whether the rounds are an exchange's or a delivery's (delivery_shifts).
struct RoundsKey {
  LinkAbilities abilities;
  bool delivery = false;

  friend constexpr bool operator==(const RoundsKey&, const RoundsKey&) noexcept = default;
};

// The shifts in which an exchange (not from a Partial) runs as one round each
// (shifts_past_bound), on a bounded plan (Plan::memory_bounded), a mesh of 3 or more ranks and
// a link that may take several calls for a step; none for one round.
inline std::vector<int> exchange_shifts(const Plan& plan, const Step& step, LinkAbilities a) {
  if (!plan.memory_bounded() || a.one_call_per_step || step.kind != StepKind::exchange ||
      plan.src().mesh().size() < 3 || exchange_reduces(step.before, step.after))
    return {};
  return round_shifts_memo<RoundsKey>().get(plan, step, RoundsKey{a, false}, [&] {
    return shifts_past_bound(
        plan, step,
        [&](const MeshCoord& c) {
          ExchangeWay w = exchange_pieces(plan, step, c, a.strided_exchange);
          const std::size_t staged = w.send + w.recv;
          return OneRound{staged, std::move(w)};
        },
        &a);
  });
}

// Lays out the staging of the exchange pieces `w` of the rank at `me` for one round per shift
// of `shifts` (ExchangeWay::rounds): each round's pieces from the start of the buffers, the
// largest round's staging.
inline void stage_in_rounds(ExchangeWay& w, const std::vector<int>& shifts, const DeviceMesh& mesh,
                            const MeshCoord& me, std::size_t elem) {
  const int ranks = mesh.size(), at = mesh.index(me);
  w.send = w.recv = 0;
  auto stage = [elem](std::vector<ExchangeWay::Piece>& pieces, int peer, std::size_t& most) {
    std::size_t bytes = 0;
    for (ExchangeWay::Piece& p : pieces)
      if (p.peer == peer && !p.in_place) {
        p.at = bytes;
        bytes += bytes_of(p.box, elem);
      }
    most = std::max(most, bytes);
  };
  for (const int s : shifts) {
    const ExchangeWay::Round round{mesh.rank_at((at + s) % ranks),
                                   mesh.rank_at((at - s + ranks) % ranks)};
    w.rounds.push_back(round);
    stage(w.outgoing, round.to, w.send);
    stage(w.incoming, round.from, w.recv);
  }
}

// The dim an exchange's piece is cut along into bands: its outermost of extent over 1 (its last
// where none is).
inline std::size_t band_dim(const Box& piece) {
  std::size_t d = 0;
  while (d + 1 < piece.shape.size() && piece.shape[d] == 1) ++d;
  return d;
}

// Band k of `bands` of an exchange's piece (ExchangeWay::bands): its rows along band_dim, cut as
// evenly as they go; every rank cuts a piece alike.
inline Box exchange_band(const Box& piece, int k, int bands) {
  Box b = piece;
  const std::size_t d = band_dim(piece);
  const std::int64_t rows = piece.shape[d];
  const std::int64_t start = rows * k / bands, end = rows * (k + 1) / bands;
  b.offset[d] += start;
  b.shape[d] = end - start;
  return b;
}

// The part of round `round` of the exchange pieces `w` that moves band k of each of its pieces
// (exchange_band), none where the band is empty: each where it lies in the block `have` (sent)
// or the target `want` (received) as exchange_piece finds it, else staged from the start of
// the buffers.
inline ExchangeWay band_round(const ExchangeWay& w, const ExchangeWay::Round& round, int k,
                              const Box& have, const Box& want, std::size_t elem) {
  ExchangeWay b;
  for (const ExchangeWay::Piece& p : w.outgoing)
    if (p.peer == round.to)
      if (const Box x = exchange_band(p.box, k, w.bands); !x.empty())
        b.outgoing.push_back(exchange_piece(p.peer, x, have, elem, w.strided, b.send));
  for (const ExchangeWay::Piece& p : w.incoming)
    if (p.peer == round.from)
      if (const Box x = exchange_band(p.box, k, w.bands); !x.empty())
        b.incoming.push_back(exchange_piece(p.peer, x, want, elem, w.strided, b.recv));
  return b;
}

// Sizes the staging of the exchange pieces `w`, in rounds, for `bands` parts of each round: the
// largest part's staging on each side.
inline void stage_in_bands(ExchangeWay& w, int bands, const Box& have, const Box& want,
                           std::size_t elem) {
  w.bands = bands;
  if (bands == 1) return;
  w.send = w.recv = 0;
  for (const ExchangeWay::Round& r : w.rounds)
    for (int k = 0; k < bands; ++k) {
      const ExchangeWay part = band_round(w, r, k, have, want, elem);
      w.send = std::max(w.send, part.send);
      w.recv = std::max(w.recv, part.recv);
    }
}

// The outermost extent over 1 of the largest piece of the exchange pieces `w`: bands past it
// stage no less.
inline int most_bands(const ExchangeWay& w) {
  std::int64_t most = 1;
  auto rows = [](const Box& b) { return b.shape[band_dim(b)]; };
  for (const ExchangeWay::Piece& p : w.outgoing) most = std::max(most, rows(p.box));
  for (const ExchangeWay::Piece& p : w.incoming) most = std::max(most, rows(p.box));
  return static_cast<int>(std::min<std::int64_t>(most, std::numeric_limits<int>::max()));
}

// The largest room of an exchange's pieces (`w`) in the buffer of its target `want` that no
// piece it receives writes: one of its own pieces that is a slab of the target (copied after the
// rounds), and where the target lies at the start of a buffer `tail` bytes longer, those bytes
// too, alone or after an own slab that ends the target. Its bytes and where it starts there
// (ExchangeWay::own_room).
struct OwnRoom {
  std::size_t bytes = 0, at = 0;
};
inline OwnRoom own_room_of(const ExchangeWay& w, const Box& want, std::size_t elem,
                           std::size_t tail = 0) {
  const std::size_t end = bytes_of(want, elem);
  OwnRoom room{tail, end};
  for (const Box& piece : w.own)
    if (contiguous_in(piece, want)) {
      const std::size_t at = slab_offset(piece, want, elem), bytes = bytes_of(piece, elem);
      const std::size_t with_tail = at + bytes == end ? bytes + tail : bytes;
      if (with_tail > room.bytes) room = {with_tail, at};
    }
  return room.bytes > 0 ? room : OwnRoom{};
}

// The most bands a round of an exchange takes (bands_within_bound): each is one more call, whose
// latency the plan's estimated time does not count; past this many, the memory bound gives way.
inline constexpr int max_exchange_bands = 8;

// What decides an exchange's bands besides its plan and step (RoundShiftsMemo's key; the
// answer is remembered as a one-element vector): the link's abilities, and whether the rounds
// are an exchange's or a delivery's (delivery_bands).
struct BandsKey {
  LinkAbilities abilities;
  bool delivery = false;

  friend constexpr bool operator==(const BandsKey&, const BandsKey&) noexcept = default;
};

// One rank's exchange pieces in rounds, as bands_within_bound weighs them: the pieces (staged in
// rounds, stage_in_rounds), the blocks they are sent from and received into, and the rank's
// whole staging for theirs: max(floor, what they allocate beside `inside` bytes of room in the
// target) + extra.
struct RoundsAtRank {
  ExchangeWay pieces;
  Box from, into;
  std::size_t floor = 0, extra = 0, inside = 0;
};

// The bands of each round of an exchange's pieces in rounds (ExchangeWay::bands): 1, or where
// a rank's rounds stage past the larger of its source and target blocks (with the block the
// step reads and the one it writes, as shifts_past_bound weighs them), the fewest that bring
// every such rank within it where some number of bands can. `at(me, blocks)` is the rank at
// `me`'s RoundsAtRank, `blocks` its StepBlocks. Every rank decides alike: the parts of the rounds
// meet the mesh.
template <class At>
int bands_within_bound(const Plan& plan, const Step& step, At&& at,
                       const LinkAbilities* a = nullptr) {
  const DeviceMesh& mesh = plan.src().mesh();
  const auto elem = static_cast<std::size_t>(plan.src().elem_bytes());
  int bands = 1;
  for (int r = 0; r < mesh.size(); ++r) {
    const MeshCoord c = mesh.coordinate_at(r);
    const StepBlocks bound = step_blocks_at(plan, step, c, a);
    const RoundsAtRank x = at(c, bound);
    if (bound.blocks + x.extra > bound.ends) continue;  // no room even for pieces in place
    const std::size_t room = bound.ends - bound.blocks;
    auto staged = [&](int b) {
      ExchangeWay y = x.pieces;
      stage_in_bands(y, b, x.from, x.into, elem);
      return std::max(x.floor, y.with_spare(x.inside).allocated()) + x.extra;
    };
    const int most = std::min(most_bands(x.pieces), max_exchange_bands);
    if (staged(bands) <= room || most <= bands || staged(most) > room) continue;
    // The fewest bands that fit, from an estimate (the pieces' staging shared out), by
    // bisection: a band's staging shrinks as the bands grow, to rounding (and pieces whose
    // bands lie in place).
    const std::size_t pieces = x.pieces.send + x.pieces.recv, share = room - x.extra;
    int low = bands, b = most;  // low stages past room, b fits
    if (share > 0 && pieces / share + 1 < static_cast<std::size_t>(most)) {
      const int guess = std::max(bands + 1, static_cast<int>((pieces + share - 1) / share));
      if (staged(guess) <= room)
        b = guess;
      else
        low = guess;
    }
    while (b - low > 1) {
      const int mid = low + (b - low) / 2;
      if (staged(mid) <= room)
        b = mid;
      else
        low = mid;
    }
    bands = b;
  }
  return bands;
}

// The bands of each round of an exchange in rounds (exchange_shifts; bands_within_bound).
inline int exchange_bands(const Plan& plan, const Step& step, LinkAbilities a) {
  const std::vector<int> shifts = exchange_shifts(plan, step, a);
  if (shifts.empty()) return 1;
  return round_shifts_memo<BandsKey>()
      .get(plan, step, BandsKey{a, false},
           [&] {
             const DeviceMesh& mesh = plan.src().mesh();
             return std::vector<int>{bands_within_bound(
                 plan, step,
                 [&](const MeshCoord& c, const StepBlocks& blocks) {
                   RoundsAtRank x{exchange_pieces(plan, step, c, a.strided_exchange),
                                  plan.src().local_box(step.before, c),
                                  plan.src().local_box(step.after, c)};
                   const auto elem = static_cast<std::size_t>(plan.src().elem_bytes());
                   stage_in_rounds(x.pieces, shifts, mesh, c, elem);
                   // Where the block can lie in the target, its room past the block too.
                   const std::size_t block = bytes_of(x.into, elem),
                                     target = bytes_of(plan.dst().local_box(c), elem);
                   const std::size_t tail = target > block && blocks.in_target ? target - block : 0;
                   x.inside = own_room_of(x.pieces, x.into, elem, tail).bytes;
                   return x;
                 },
                 &a)};
           })
      .front();
}

inline ExchangeWay exchange_way(const StepContext& c, LinkAbilities a) {
  ExchangeWay w = exchange_pieces(c.plan, c.step, c.me, a.strided_exchange);
  if (!c.messages)
    if (const std::vector<int> shifts = exchange_shifts(c.plan, c.step, a); !shifts.empty()) {
      stage_in_rounds(w, shifts, c.plan.src().mesh(), c.me, c.elem);
      stage_in_bands(w, exchange_bands(c.plan, c.step, a), c.have, c.want, c.elem);
    }
  w.use_spare(c.spare_bytes);
  // On a bounded plan, the region of the target that this rank's own piece fills is free until
  // that piece is copied: copied after the rounds, its largest slab of the target holds what
  // staging it can (the pieces received go elsewhere in the target), and so does the caller's
  // target past the block where the step writes its block at the target's start (out_bytes).
  if (!c.plan.memory_bounded() || w.allocated() == 0) return w;
  const std::size_t block = bytes_of(c.want, c.elem);
  const OwnRoom room =
      own_room_of(w, c.want, c.elem, !c.banded && c.out_bytes > block ? c.out_bytes - block : 0);
  const Staging in_own = w.with_spare(room.bytes);
  if (in_own.allocated() < w.allocated()) {
    w.send_spare = in_own.send_spare;
    w.recv_spare = in_own.recv_spare;
    w.own_room = true;
    w.own_room_at = room.at;
  }
  return w;
}

// One round of an exchange's pieces `w` (move_pieces): those to global rank `to` and from
// global rank `from_peer`, or (both -1) every piece.
template <class L, class Ops>
Task<void> move_round(L link, const Ops& ops, const ExchangeWay& w, const std::byte* from,
                      const Box& from_box, std::byte* out, const Box& want, std::byte* send,
                      std::byte* recv, std::size_t elem, int to, int from_peer) {
  Messages m;
  for (const ExchangeWay::Piece& p : w.outgoing) {
    if (to >= 0 && p.peer != to) continue;
    if (!p.in_place) copy_piece(ops, from, from_box, send + p.at, p.box, p.box, elem);
    m.send(p.peer, (p.in_place ? from : send) + p.at, p.runs);
  }
  auto received = [&](const ExchangeWay::Piece& p) { return from_peer < 0 || p.peer == from_peer; };
  for (const ExchangeWay::Piece& p : w.incoming)
    if (received(p)) m.recv(p.peer, (p.in_place ? out : recv) + p.at, p.runs);
  co_await send_and_receive(link, m);
  for (const ExchangeWay::Piece& p : w.incoming)
    if (received(p) && !p.in_place) copy_piece(ops, recv + p.at, p.box, out, want, p.box, elem);
}

// Runs an exchange's pieces `w` from the block `from` (box `from_box`) into the block `out`
// (box `want`): copies this rank's own pieces (after the rounds where their room stages,
// ExchangeWay::own_room), sends and receives the others where they lie or packed at `send` and
// staged at `recv`, and unpacks those; in one round, or in w.rounds.
template <class L, class Ops>
Task<void> move_pieces(L link, const Ops& ops, const ExchangeWay& w, const std::byte* from,
                       const Box& from_box, std::byte* out, const Box& want, std::byte* send,
                       std::byte* recv, std::size_t elem) {
  if (!w.own_room)
    for (const Box& piece : w.own) copy_piece(ops, from, from_box, out, want, piece, elem);
  if (w.rounds.empty())
    co_await move_round(link, ops, w, from, from_box, out, want, send, recv, elem, -1, -1);
  for (const ExchangeWay::Round& r : w.rounds) {
    if (w.bands == 1) {
      co_await move_round(link, ops, w, from, from_box, out, want, send, recv, elem, r.to, r.from);
      continue;
    }
    for (int k = 0; k < w.bands; ++k)
      co_await move_round(link, ops, band_round(w, r, k, from_box, want, elem), from, from_box, out,
                          want, send, recv, elem, -1, -1);
  }
  if (w.own_room)
    for (const Box& piece : w.own) copy_piece(ops, from, from_box, out, want, piece, elem);
}

// How an exchange from a Partial (reduce_exchange.hpp) moves its pieces on this rank. First
// round: this member's partial of every other member's part out, from where it lies in the
// block when one run of it or (on a link that moves strided messages) runs of one stride, else
// packed; every other member's partial of its own part in, each staged in a slot of the receive
// staging, in group order. This member's own partial is read where it lies likewise, else
// copied to its slot. The reduction lands in the first slot. Second round (`deliver`, staged
// where the first round's dead bytes were): as an exchange, from the reduced part to the target
// block. A group that cuts its block by elements in row-major order (GroupParts::by_elements)
// sends each part from where it lies, one run of the block; the first slot then spans
// `reduced_box`, the box of whole rows around this member's run (one run of the block too), with
// the run `lead` bytes into it, so that the second round finds every piece of the part where it
// lies in that box. A group that cuts by elements with another tensor dim outermost
// (GroupParts::outer) packs each part's boxes (`boxes`) one after another, every member alike;
// the reduced part, packed so in the first slot, is then laid out in `reduced_box` (the whole
// columns around it) after the slots. In rounds
// (reduces_parts_in_rounds) two slots: the reduced part and the one each partial comes into,
// which lies over the packed partials (packed in the member's own round, dead after it).
// The first round's packed partials and its slots but the first (in this order, the first
// round's bytes) are dead once the part is reduced, before the second round writes the target:
// as many of them as fit lie in the step's target block (`first_round_in_target` bytes), the
// others at the front of the send staging. In one round, a member whose own partial is packed
// may take no slot for it (`own_in_bands`): the first partial it receives lands in the first
// slot, and after the round it copies its own partial a band of the part's rows at a time into
// the target block's room that the slots leave (`band_at`, `band_rows` rows) and reduces each
// band there, the parts in group order as before.
struct ReducingExchangeWay : Staging {
  int me = 0;
  ReduceOp op = ReduceOp::sum;
  std::vector<int> peers;        // the group's members, as global ranks
  std::vector<Box> parts;        // their parts (by elements: the box around each run)
  std::vector<RunBoxes> boxes;   // packed runs only: each part's boxes, in the run's order
  std::vector<PieceRuns> where;  // where each part lies in the block, or is packed
  std::vector<bool> in_place;    // whether it lies in the block (`where` there)
  std::size_t part_bytes = 0;    // this member's part
  bool own_in_place = false;     // this member's partial of its part read where it lies
  bool rounds = false;           // one round per member (reduces_parts_in_rounds)
  std::size_t slots = 0;         // partials staged
  std::size_t first_slot = 0;    // the first slot's bytes (the reduced part's)
  Box reduced_box;               // how the reduced part lies in the receive staging
  std::size_t box_at = 0;        // where that box starts there (packed runs: after the slots)
  std::size_t lead = 0;          // where the part starts in the first slot
  std::size_t packed = 0;        // the first round's packed partials (its slots after them,
                                 // in rounds its slot over them)
  std::size_t first_round_in_target = 0;
  bool own_in_bands = false;
  std::size_t band_at = 0;
  std::int64_t band_rows = 0;
  ExchangeWay deliver;
  // The receive staging holds the slots not in the target (the first one first) and, for
  // packed runs, the box; the send staging the first round's bytes not in the target, then,
  // once they are dead, the second round's packed pieces and after them its staged ones.
  std::size_t first_round_rest = 0;
  std::size_t deliver_recv_at = 0;  // in the send staging, after the second round's sends

  void size_staging(std::size_t slots_bytes) {
    deliver_recv_at = deliver.send;
    send = std::max(first_round_rest, deliver.send + deliver.recv);
    recv = slots_bytes;
  }

  // Where byte `x` of the first round lies: in the target block `out` or the send staging. A
  // piece of no bytes past the target's share may find no send staging (`send` null): it is
  // given that null, never an offset from it.
  [[nodiscard]] std::byte* first_round_at(std::size_t x, std::byte* out, std::byte* send) const {
    if (x < first_round_in_target) return out + x;
    return send == nullptr ? nullptr : send + (x - first_round_in_target);
  }
};

// The smallest box that is one run of `block` in the order of its elements with tensor dim
// `outer` outermost and holds its elements [a, b) there (b > a): the indices of the first dim in
// that order where a's and b-1's differ, whole dims after it, one index of those before.
inline Box run_bounds(const Box& block, std::int64_t a, std::int64_t b, int outer = 0) {
  const Box moved = outer_first(block, outer);
  Box out = moved;
  std::int64_t inner = moved.numel();
  for (std::size_t d = 0; d < moved.shape.size(); ++d) {
    inner /= moved.shape[d];
    const std::int64_t first = a / inner, last = (b - 1) / inner;
    out.offset[d] = moved.offset[d] + first;
    out.shape[d] = last - first + 1;
    if (first != last) break;
    a -= first * inner;
    b -= first * inner;
  }
  return outer_back(out, outer);
}

// Copies part j of an exchange from a Partial from `from` (this rank's block, `from_box`) to
// `to`: packed, its boxes one after another where the way packs runs, else as its box.
template <class Ops>
void pack_part(const Ops& ops, const ReducingExchangeWay& w, std::size_t j, const std::byte* from,
               const Box& from_box, std::byte* to, std::size_t elem) {
  if (w.boxes.empty()) {
    copy_piece(ops, from, from_box, to, w.parts[j], w.parts[j], elem);
    return;
  }
  for (const Box& piece : w.boxes[j]) {
    copy_piece(ops, from, from_box, to, piece, piece, elem);
    to += bytes_of(piece, elem);
  }
}

// How the rank of `c` runs an exchange from a Partial, its delivery in one round, the staging
// not yet placed in spare room (what delivery_shifts weighs).
inline ReducingExchangeWay reducing_exchange_pieces(const StepContext& c, LinkAbilities a) {
  const Layout& base = c.plan.src();
  const DeviceMesh& mesh = base.mesh();
  const Placements& before = c.step.before;
  const Placements& after = c.step.after;
  const ReducedPartials reduced = reduced_partials(before, after);
  const GroupParts gp = group_parts(base, before, after, reduced.dims, c.me, c.step.by_elements);
  ReducingExchangeWay w;
  w.op = reduced.op;
  w.me = group_index(mesh, c.me, reduced.dims);
  std::size_t packed = 0;
  const bool packed_runs = gp.by_elements && gp.outer != 0;
  for (int j = 0; j < gp.members; ++j) {
    w.peers.push_back(mesh.rank(group_member(mesh, c.me, reduced.dims, j)));
    if (gp.by_elements) {  // a run of the block's elements (gp.block, this rank's block before)
      const std::int64_t first = gp.part_first(j), n = gp.part_numel(j);
      const std::size_t bytes = static_cast<std::size_t>(n) * c.elem;
      Box none = gp.block;
      none.shape[0] = 0;
      w.parts.push_back(n == 0 ? none : run_bounds(gp.block, first, first + n, gp.outer));
      if (j == w.me) w.part_bytes = bytes;
      if (packed_runs) {  // in another order: its boxes, packed
        w.boxes.push_back(gp.part_boxes(j));
        w.in_place.push_back(false);
        w.where.push_back(PieceRuns{packed, {1, bytes, bytes}});
        if (j != w.me) packed += bytes;
        continue;
      }
      // In row-major order: one run of the block, where it lies.
      w.in_place.push_back(n != 0);
      w.where.push_back(PieceRuns{static_cast<std::size_t>(first) * c.elem, {1, bytes, bytes}});
      if (j == w.me && n != 0)
        w.lead = static_cast<std::size_t>(first) * c.elem -
                 slab_offset(w.parts.back(), gp.block, c.elem);
      continue;
    }
    const Box part = gp.part(j);
    w.parts.push_back(part);
    const std::size_t bytes = bytes_of(part, c.elem);
    std::optional<PieceRuns> runs;
    if (contiguous_in(part, c.have))
      runs = PieceRuns{slab_offset(part, c.have, c.elem), {1, bytes, bytes}};
    else if (a.strided_exchange)
      runs = runs_of(part, c.have, c.elem);
    w.in_place.push_back(runs.has_value() && !part.empty());
    w.where.push_back(runs ? *runs : PieceRuns{packed, {1, bytes, bytes}});
    if (j != w.me && !runs) packed += bytes;
    if (j == w.me) w.part_bytes = bytes;
  }
  const auto me = static_cast<std::size_t>(w.me);
  w.reduced_box = w.parts[me];
  const Box& own = w.reduced_box;
  w.own_in_place = w.in_place[me] && w.parts.size() > 1;
  w.rounds = reduces_parts_in_rounds(c.plan, c.step, a) > 0;
  // In rounds: the reduced part and one slot for each part as it comes.
  w.slots = w.rounds ? 2 : w.parts.size() - (w.own_in_place ? 1 : 0);
  w.deliver.strided = a.strided_exchange;
  for_each_owned_target(
      base, before, after, gp.part_boxes(w.me), c.me,
      [&](const MeshCoord& receiver, const Box& piece) {
        if (receiver == c.me) {
          w.deliver.own.push_back(piece);
          return;
        }
        w.deliver.outgoing.push_back(exchange_piece(mesh.rank(receiver), piece, own, c.elem,
                                                    a.strided_exchange, w.deliver.send));
      });
  for_each_owner(
      base, before, after, reduced.dims, c.step.by_elements, c.me,
      [&](const MeshCoord& owner, const Box& piece) {
        if (owner == c.me) return;  // among deliver.own
        w.deliver.incoming.push_back(exchange_piece(mesh.rank(owner), piece, c.want, c.elem,
                                                    a.strided_exchange, w.deliver.recv));
      });
  // The first round's bytes: the partials packed, then the slots but the first; the longest
  // run of them from the start whose pieces fit whole in the target block lies there.
  w.packed = packed;
  const std::size_t room = bytes_of(c.want, c.elem);
  auto place_first_round = [&] {
    const std::size_t later = w.slots > 1 ? w.part_bytes * (w.slots - 1) : 0;
    w.first_round_in_target = 0;
    for (std::size_t j = 0; j < w.parts.size(); ++j) {
      if (j == me || w.in_place[j] || w.parts[j].empty()) continue;
      const std::size_t end = w.where[j].offset + w.where[j].runs.piece_bytes();
      if (end > room) break;
      w.first_round_in_target = end;
    }
    if (w.first_round_in_target == packed)
      w.first_round_in_target +=
          std::min(later, room - packed) / std::max<std::size_t>(w.part_bytes, 1) * w.part_bytes;
    return later;
  };
  std::size_t later_slots = place_first_round();
  // The own partial in bands: where it is packed into a slot of its own in one round (not by
  // elements). The bands lie in the larger room of the target the slots there leave: before
  // them (the packed partials', dead after the round) or after them. Bounded plans take as
  // many bands as that room needs; others only one, which costs no call more.
  if (!w.rounds && !gp.by_elements && !w.own_in_place && w.parts.size() > 1 && w.part_bytes > 0) {
    --w.slots;
    const std::size_t later = place_first_round();
    // The slots in the target: [packed, first_round_in_target), where all packed ones fit.
    const bool slots_there = w.first_round_in_target > packed;
    const std::size_t slots_begin = slots_there ? packed : 0;
    const std::size_t slots_end = slots_there ? w.first_round_in_target : 0;
    const std::size_t band_room = std::max(slots_begin, room - slots_end);
    const auto rows = own.shape[0];
    const std::size_t row_bytes = w.part_bytes / static_cast<std::size_t>(rows);
    const auto fit = static_cast<std::int64_t>(band_room / row_bytes);
    if (fit >= (c.plan.memory_bounded() ? 1 : rows)) {
      w.own_in_bands = true;
      w.band_at = slots_begin >= room - slots_end ? 0 : slots_end;
      w.band_rows = std::min(fit, rows);
      later_slots = later;
    } else {
      ++w.slots;
      later_slots = place_first_round();
    }
  }
  // In rounds a member packs its partials of the other parts in its own round, and they are
  // dead after it, while its slot takes a partial in every other round: the slot lies over
  // them, from the first round's first byte. The longest run from the start of whole pieces
  // (the partials, and the slot) that fits lies in the target.
  if (w.rounds) {
    const std::size_t bytes = std::max(packed, w.part_bytes);
    std::size_t in_target = bytes <= room ? bytes : 0;
    for (std::size_t j = 0; j < w.parts.size() && bytes > room; ++j) {
      if (j == me || w.in_place[j] || w.parts[j].empty()) continue;
      const std::size_t end = w.where[j].offset + w.where[j].runs.piece_bytes();
      if (end > room) break;
      if (end >= w.part_bytes) in_target = end;
    }
    w.first_round_in_target = in_target;
    w.first_round_rest = bytes - in_target;
  } else {
    w.first_round_rest = packed + later_slots - w.first_round_in_target;
  }
  // The first slot spans the reduced box (by elements, up to a row more than the part), else
  // (packed runs) holds the packed part, the box after it. The slots but the first are in the
  // first round's bytes.
  w.first_slot = packed_runs ? w.part_bytes : bytes_of(own, c.elem);
  w.box_at = packed_runs ? w.first_slot : 0;
  w.size_staging(packed_runs ? w.box_at + bytes_of(own, c.elem) : w.first_slot);
  return w;
}

// How the rank of `c` runs an exchange from a Partial: reducing_exchange_pieces, its delivery
// in rounds where delivery_shifts says, the staging in spare room where it fits.
inline ReducingExchangeWay reducing_exchange_way(const StepContext& c, LinkAbilities a) {
  ReducingExchangeWay w = reducing_exchange_pieces(c, a);
  if (!c.messages)
    if (const std::vector<int> shifts = delivery_shifts(c, a); !shifts.empty()) {
      stage_in_rounds(w.deliver, shifts, c.plan.src().mesh(), c.me, c.elem);
      stage_in_bands(w.deliver, delivery_bands(c, a), w.reduced_box, c.want, c.elem);
      w.size_staging(w.recv);
    }
  w.use_spare(c.spare_bytes);
  return w;
}

// Step c as the rank at `me` runs it: that rank's blocks, no spare room.
inline StepContext at_rank(const StepContext& c, const MeshCoord& me) {
  StepContext r = c;
  r.me = me;
  r.have = c.before.local_box(me);
  r.want = c.after.local_box(me);
  r.spare = nullptr;
  r.spare_bytes = 0;
  return r;
}

// The context of `step` of `plan` on the rank at `me`: one collective (not even, not messages),
// no spare room, no band.
inline StepContext context_at(const Plan& plan, const Step& step, const MeshCoord& me) {
  const Layout& base = plan.src();
  return {plan,
          base.with_placements(step.before),
          base.with_placements(step.after),
          me,
          base.local_box(step.before, me),
          base.local_box(step.after, me),
          static_cast<std::size_t>(base.elem_bytes()),
          false,
          false,
          step};
}

// The shifts in which the delivery (second round) of an exchange from a Partial runs as one
// round each, as exchange_shifts decides for an exchange, weighing the whole step's one-round
// staging and its delivery's pieces (shifts_past_bound).
inline std::vector<int> delivery_shifts(const StepContext& c, LinkAbilities a) {
  const Plan& plan = c.plan;
  if (!plan.memory_bounded() || a.one_call_per_step || c.step.kind != StepKind::exchange ||
      plan.src().mesh().size() < 3 || !exchange_reduces(c.step.before, c.step.after))
    return {};
  return round_shifts_memo<RoundsKey>().get(plan, c.step, RoundsKey{a, true}, [&] {
    return shifts_past_bound(plan, c.step, [&](const MeshCoord& me) {
      ReducingExchangeWay w = reducing_exchange_pieces(at_rank(c, me), a);
      return OneRound{w.send + w.recv, std::move(w.deliver)};
    });
  });
}

// The bands of each round of the delivery of an exchange from a Partial in rounds
// (delivery_shifts; bands_within_bound), weighing the whole step's staging.
inline int delivery_bands(const StepContext& c, LinkAbilities a) {
  const std::vector<int> shifts = delivery_shifts(c, a);
  if (shifts.empty()) return 1;
  return round_shifts_memo<BandsKey>()
      .get(c.plan, c.step, BandsKey{a, true},
           [&] {
             return std::vector<int>{
                 bands_within_bound(c.plan, c.step, [&](const MeshCoord& me, const StepBlocks&) {
                   const StepContext r = at_rank(c, me);
                   ReducingExchangeWay w = reducing_exchange_pieces(r, a);
                   stage_in_rounds(w.deliver, shifts, c.plan.src().mesh(), me, c.elem);
                   return RoundsAtRank{std::move(w.deliver), w.reduced_box, r.want,
                                       w.first_round_rest, w.recv};
                 })};
           })
      .front();
}

// The first round of an exchange from a Partial as one round per member
// (reduces_parts_in_rounds): in round t member t sends every other member its partial of that
// member's part (from where it lies, or packed then in the first round's bytes, first_round_at
// `out` and `send`), and the others receive it into `reduced` (t = 0) or the later slot (over
// the packed partials: not yet packed, or dead), folded into `reduced` after the round; member
// t folds its own.
template <class L, class Ops>
Task<void> reduce_parts_in_rounds(L link, const Ops& ops, const StepContext& c,
                                  const ReducingExchangeWay& w, const std::byte* cur,
                                  std::byte* out, std::byte* send, std::byte* reduced) {
  const auto me = static_cast<std::size_t>(w.me);
  const DType dtype = c.plan.src().dtype();
  const std::size_t count = w.part_bytes / c.elem;
  std::byte* const slot = w.first_round_at(0, out, send);
  for (std::size_t t = 0; t < w.parts.size(); ++t) {
    Messages round;
    if (t == me) {
      for (std::size_t j = 0; j < w.parts.size(); ++j)
        if (j != me && !w.parts[j].empty() && !w.in_place[j])
          pack_part(ops, w, j, cur, c.have, w.first_round_at(w.where[j].offset, out, send), c.elem);
      for (std::size_t j = 0; j < w.parts.size(); ++j)
        if (j != me && !w.parts[j].empty())
          round.send(w.peers[j],
                     w.in_place[j] ? cur + w.where[j].offset
                                   : w.first_round_at(w.where[j].offset, out, send),
                     w.where[j].runs);
    } else if (w.part_bytes != 0) {
      round.recv(w.peers[t], t == 0 ? reduced : slot, w.part_bytes);
    }
    co_await send_and_receive(link, round);
    if (w.part_bytes == 0 || (t == 0 && t != me)) continue;
    const PieceRuns& own = w.where[me];
    if (t == me && !w.own_in_place) {  // packed into the slot, or (t = 0) into `reduced`
      pack_part(ops, w, me, cur, c.have, t == 0 ? reduced : slot, c.elem);
      if (t == 0) continue;
    } else if (t == 0) {  // the own partial where it lies, as the first part
      copy_piece(ops, cur, c.have, reduced, w.parts[me], w.parts[me], c.elem);
      continue;
    }
    const std::vector<const void*> both{
        reduced, t == me && w.own_in_place ? static_cast<const void*>(cur + own.offset) : slot};
    if (t == me && w.own_in_place && own.runs.rows > 1)
      reduce_with_runs(ops, dtype, reduced, both, 1, cur + own.offset, own.runs, c.elem, w.op);
    else
      ops.reduce(dtype, reduced, both, count, w.op);
  }
}

// An exchange from a Partial: each member reduces its part from the group's partials of it, in
// group order (ranks holding the same part compute bit-identical values), then every rank
// takes its target block from the owners.
template <class L, class Ops>
Task<std::size_t> run_reducing_exchange(L link, const Ops& ops, const StepContext& c,
                                        const std::byte* cur, std::byte* out) {
  const ReducingExchangeWay w = reducing_exchange_way(c, link_abilities(link));
  const StagingBuffers b(ops, w, c.spare);
  const auto me = static_cast<std::size_t>(w.me);
  const bool own_in_place = w.own_in_place;
  // The first slot holds the reduced part, `lead` bytes into it; the others follow.
  std::byte* reduced = b.recv + w.lead;
  if (w.rounds) {
    co_await reduce_parts_in_rounds(link, ops, c, w, cur, out, b.send, reduced);
    co_await move_pieces(link, ops, w.deliver, reduced, w.reduced_box, out, c.want, b.send,
                         b.send + w.deliver_recv_at, c.elem);
    co_return b.allocated();
  }
  Messages m;
  std::vector<const void*> partials(w.parts.size());
  std::size_t slots = 0;
  for (std::size_t j = 0; j < w.parts.size(); ++j) {
    if (j == me && own_in_place) {
      partials[j] = cur + w.where[j].offset;
      continue;
    }
    if (j == me && w.own_in_bands) continue;  // copied after the round, a band at a time
    std::byte* slot =
        slots == 0 ? reduced : w.first_round_at(w.packed + (slots - 1) * w.part_bytes, out, b.send);
    ++slots;
    partials[j] = slot;
    if (j == me) {
      if (w.part_bytes != 0) pack_part(ops, w, j, cur, c.have, slot, c.elem);
      continue;
    }
    const Box& part = w.parts[j];
    if (!part.empty()) {
      const PieceRuns& at = w.where[j];
      std::byte* const packed_at = w.first_round_at(at.offset, out, b.send);
      if (!w.in_place[j]) pack_part(ops, w, j, cur, c.have, packed_at, c.elem);
      m.send(w.peers[j], w.in_place[j] ? cur + at.offset : packed_at, at.runs);
    }
    if (w.part_bytes != 0) m.recv(w.peers[j], slot, w.part_bytes);
  }
  co_await send_and_receive(link, m);
  const DType dtype = c.plan.src().dtype();
  if (w.part_bytes == 0) {
  } else if (w.own_in_bands) {
    reduce_own_in_bands(ops, dtype, reduced, partials, me, cur, c.have, w.parts[me],
                        out + w.band_at, w.band_rows, c.elem, w.op);
  } else if (own_in_place && w.where[me].runs.rows > 1) {
    reduce_with_runs(ops, dtype, reduced, partials, me, cur + w.where[me].offset, w.where[me].runs,
                     c.elem, w.op);
  } else {
    ops.reduce(dtype, reduced, partials, w.part_bytes / c.elem, w.op);
  }
  std::byte* const box = b.recv + w.box_at;
  if (!w.boxes.empty()) {  // packed runs: the reduced part laid out in its box
    const std::byte* from = reduced;
    for (const Box& piece : w.boxes[me]) {
      copy_piece(ops, from, piece, box, w.reduced_box, piece, c.elem);
      from += bytes_of(piece, c.elem);
    }
  }
  co_await move_pieces(link, ops, w.deliver, box, w.reduced_box, out, c.want, b.send,
                       b.send + w.deliver_recv_at, c.elem);
  co_return b.allocated();
}

template <class L, class Ops>
Task<std::size_t> run_exchange(L link, const Ops& ops, const StepContext& c, const std::byte* cur,
                               std::byte* out) {
  if (exchange_reduces(c.step.before, c.step.after))
    co_return co_await run_reducing_exchange(link, ops, c, cur, out);
  const ExchangeWay w = exchange_way(c, link_abilities(link));
  // Into a Partial: the identity wherever another member of the group holds the value.
  if (makes_partial(c.step.before, c.step.after))
    ops.fill_identity(c.plan.src().dtype(), out, static_cast<std::size_t>(c.want.numel()),
                      made_partial_op(c.step.before, c.step.after));
  const StagingBuffers b(ops, w, w.own_room ? out + w.own_room_at : c.spare);
  co_await move_pieces(link, ops, w, cur, c.have, out, c.want, b.send, b.recv, c.elem);
  co_return b.allocated();
}

// Whether step c can run with its target in the buffer of its block (in place): a step that
// keeps the block (identity, scale), an all-reduce the backend runs in place, an even
// all-to-all that packs its pieces out first, or a fill where the link's ops fill around a
// block in place (the block before at the start of the target).
inline bool runs_in_place(const StepContext& c, LinkAbilities a) {
  switch (c.step.kind) {
    case StepKind::identity:
    case StepKind::scale: return true;
    case StepKind::fill: return a.fills_in_place;
    case StepKind::all_reduce: return !c.messages;
    case StepKind::all_to_all: return c.even;
    default: return false;
  }
}

// Bytes of staging step c takes on its rank over a link with abilities `a` (what its run_*
// allocates), `in_place` or not (runs_in_place).
inline std::size_t step_staging(const StepContext& c, LinkAbilities a, bool in_place = false) {
  switch (c.step.kind) {
    case StepKind::all_gather: return gather_way(c, a).allocated();
    case StepKind::reduce_scatter: {
      if (!scatters_by_messages(c, a)) return scatter_way(c).allocated();
      const int k = c.step.mesh_dim, j_dim = c.step.after[k].dim();
      return exchange_reduce_way(
                 c, slabs_along(c.have.shape, j_dim),
                 [&c](int j) { return member_box(c, c.after, j); }, a)
          .allocated();
    }
    case StepKind::all_reduce:
      if (c.messages)
        return exchange_reduce_way(
                   c, true, [&c](int) { return c.have; }, a)
            .allocated();
      return all_reduces_by_messages(c, a) ? all_reduce_slices_way(c).allocated() : 0;
    case StepKind::all_to_all: return all_to_all_way(c, a, in_place).allocated();
    case StepKind::exchange:
      return exchange_reduces(c.step.before, c.step.after) ? reducing_exchange_way(c, a).allocated()
                                                           : exchange_way(c, a).allocated();
    default: return 0;
  }
}

// Step c cut to rows [start, start + size) of tensor dim 0 (band_rows).
inline StepContext banded(const StepContext& c, std::int64_t start, std::int64_t size) {
  StepContext b = c;
  b.banded = true;
  b.band = {c.have.offset[0] + start, size};
  b.have.offset[0] = b.want.offset[0] = b.band.start;
  b.have.shape[0] = b.want.shape[0] = size;
  return b;
}

// Step c as member j of its group runs it: that member's blocks, no spare room.
inline StepContext as_member(const StepContext& c, int j) {
  StepContext m = c;
  m.me[c.step.mesh_dim] = j;
  m.have = c.before.local_box(m.me);
  m.want = c.after.local_box(m.me);
  m.spare = nullptr;
  m.spare_bytes = 0;
  return m;
}

// On a bounded plan (Plan::memory_bounded), a native all-gather, reduce-scatter or all-to-all (even
// or padded) that stages more than a member of its group has room for runs in bands of tensor dim
// 0, one collective of the group per band, each moving its rows: the rows per band, 0 for one call.
// A member's room is the larger of its source and target blocks less the blocks the step
// reads and writes, counted as held in scratch unless they are the source (the first stage) or
// the target (the last). Every member computes the same figure, from every member's staging
// (a padded piece is staged to send where it is not whole) and room. The step must not cut dim
// 0, which its group then holds alike. Not for point-to-point rounds (the whole mesh meets in
// each), nor on a link that runs a step as one operation, nor where one row does not fit.
inline std::int64_t band_rows(const StepContext& c, LinkAbilities a, bool first, bool last) {
  const Plan& plan = c.plan;
  if (a.one_call_per_step || !plan.memory_bounded() || c.messages || !(c.even || c.step.padded) ||
      c.have.shape.empty())
    return 0;
  switch (c.step.kind) {
    case StepKind::all_gather:
    case StepKind::all_to_all: break;
    case StepKind::reduce_scatter:
      if (scatters_by_messages(c, a)) return 0;
      break;
    default: return 0;
  }
  const int k = c.step.mesh_dim;
  const std::int64_t rows = c.have.shape[0];
  if (c.step.before[k].is_shard(0) || c.step.after[k].is_shard(0) || rows < 2) return 0;
  std::int64_t per_band = INT64_MAX;
  bool over = false;
  for (int j = 0; j < plan.src().mesh().size(k); ++j) {
    // Every member finds the same bands, whether or not its block may be overwritten.
    StepContext m = as_member(c, j);
    m.block_writable = false;
    // An all-to-all's bands are each one call (never by peers).
    const auto staging = static_cast<std::int64_t>(
        c.step.kind == StepKind::all_to_all ? all_to_all_way_in_one_call(m, a).allocated()
                                            : step_staging(m, a));
    if (staging == 0) continue;
    const auto ends =
        static_cast<std::int64_t>(std::max(bytes_of(plan.src().local_box(m.me), c.elem),
                                           bytes_of(plan.dst().local_box(m.me), c.elem)));
    const auto held = static_cast<std::int64_t>((first ? 0 : bytes_of(m.have, c.elem)) +
                                                (last ? 0 : bytes_of(m.want, c.elem)));
    const std::int64_t room = ends - held, per_row = (staging + rows - 1) / rows;
    if (room < per_row) return 0;
    over = over || staging > room;
    per_band = std::min(per_band, room / per_row);
  }
  return over ? per_band : 0;
}

// The most staging of step c run in bands of `rows` rows (its first band and its last, the
// only sizes it has), over a link with abilities `a`.
inline std::size_t banded_staging(const StepContext& c, std::int64_t rows, LinkAbilities a) {
  const std::int64_t all = c.have.shape[0], rest = all % rows;
  const std::size_t first = step_staging(banded(c, 0, rows), a);
  return rest == 0 ? first : std::max(first, step_staging(banded(c, all - rest, rest), a));
}

// Whether an even all-to-all of a bounded plan (Plan::memory_bounded) runs by peers on a link
// that packs (no StridedAllToAll): this member's own piece copied, then g - 1 point-to-point
// rounds, in round s one piece sent to member me+s and one received from member me-s
// (run_all_to_all_by_peers), so that it stages at most one piece each way where one call packs
// and stages all g. Only where it spares something: bands cannot run (band_rows) and one call
// would take a rank past the larger of its source and target blocks, its staging beyond the
// caller's target's room beside the block it reads and the one it writes (counted in scratch
// unless the caller's source or target). Between even layouts, where every rank decides alike
// (the rounds meet the mesh); not on a link that runs a step as one operation.
inline bool all_to_all_by_peers(const Plan& plan, const Step& step, LinkAbilities a) {
  if (!plan.memory_bounded() || a.one_call_per_step || a.strided_all_to_all ||
      step.kind != StepKind::all_to_all || step.padded)
    return false;
  const Layout& base = plan.src();
  if (base.mesh().size(step.mesh_dim) < 2 || !is_even(base, base.placements()) ||
      !is_even(base, plan.dst().placements()) || !step_is_even(plan, step))
    return false;
  const MeshCoord origin(static_cast<std::size_t>(base.mesh().ndim()), 0);
  StepContext c = context_at(plan, step, origin);
  c.even = true;
  const bool first = step.before == base.placements();
  const bool last = step.after == plan.dst().placements();
  const auto staging = static_cast<std::int64_t>(all_to_all_way_in_one_call(c, a).allocated());
  const std::int64_t target = plan.dst().local_bytes(base.mesh().rank(origin));
  const std::int64_t ends = std::max(base.local_bytes(base.mesh().rank(origin)), target);
  const auto held = static_cast<std::int64_t>((first ? 0 : bytes_of(c.have, c.elem)) +
                                              (last ? 0 : bytes_of(c.want, c.elem)));
  // Bands run (band_rows, where every member is alike between even layouts) where one call is
  // over and a row's staging fits.
  const int k = step.mesh_dim;
  const std::int64_t rows = c.have.shape.empty() ? 0 : c.have.shape[0];
  const bool bands = rows >= 2 && !step.before[k].is_shard(0) && !step.after[k].is_shard(0) &&
                     staging > ends - held && ends - held >= (staging + rows - 1) / rows;
  return !bands && staging - (last ? 0 : target) + held > ends;
}

// R -> P(op) on mesh dim k, in place on `out` (a copy of the replicated block).
template <class Ops>
void make_partial(const Ops& ops, const StepContext& c, std::byte* out) {
  const int k = c.step.mesh_dim;
  const ReduceOp op = c.step.after[k].reduce_op();
  const int g = c.plan.src().mesh().size(k);
  const DType dtype = c.plan.src().dtype();
  const auto count = static_cast<std::size_t>(c.want.numel());
  if (scale_keeps_one(c.plan, op)) {
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
  // In place, the block at the start of its target: only on ops that can (runs_in_place).
  if constexpr (requires {
                  ops.fill_around_in_place(dtype, out, c.have.shape, c.want.shape, c.have.shape,
                                           op);
                }) {
    if (cur == out)
      ops.fill_around_in_place(dtype, out, c.have.shape, c.want.shape, relative(c.have, c.want),
                               op);
  }
  if (cur != out) {
    ops.fill_identity(dtype, out, count, op);
    copy_piece(ops, cur, c.have, out, c.want, c.have, c.elem);
  }
  // The rest of the block is 0, so scaling all of it scales just the piece.
  if (op == ReduceOp::avg)
    ops.multiply(dtype, out, count, c.plan.src().mesh().size(c.step.mesh_dim));
}

// Local steps first..last (local_steps_fuse) in one pass, from the block before the first to the
// block after the last: an element keeps its value where it lies in every block between, and
// is the identity a later fill gave it elsewhere (or everywhere, where a scale keeps the value
// on another member); then the scales' divisions and avg fills' multiplications, in order.
template <class Ops>
void run_local_steps(const Ops& ops, const Plan& plan, std::size_t first, std::size_t last,
                     const MeshCoord& me, const std::byte* cur, std::byte* out) {
  const Layout& base = plan.src();
  const DType dtype = base.dtype();
  const auto elem = static_cast<std::size_t>(base.elem_bytes());
  const Box have = base.local_box(plan[first].before, me);
  const Box want = base.local_box(plan[last].after, me);
  const auto count = static_cast<std::size_t>(want.numel());
  Box kept = intersect(have, want);
  bool fills = false, cleared = false;
  ReduceOp identity = ReduceOp::sum;
  for (std::size_t i = first; i <= last; ++i) {
    const Step& s = plan[i];
    kept = intersect(kept, base.local_box(s.after, me));
    if (s.kind != StepKind::fill && s.kind != StepKind::scale) continue;
    const ReduceOp op = s.after[s.mesh_dim].reduce_op();
    if (s.kind == StepKind::fill) {
      fills = true;
      identity = op;
    } else if (scale_keeps_one(plan, op) && me[s.mesh_dim] != 0) {
      cleared = true;
      identity = op;
    }
  }
  if (cleared || (fills && kept.numel() < want.numel()))
    ops.fill_identity(dtype, out, count, identity);
  if (cleared) return;  // every division or multiplication keeps the identity, 0
  // In place (local_steps_in_place), what is kept lies where it goes already.
  if (!kept.empty() && cur != out) copy_piece(ops, cur, have, out, want, kept, elem);
  for (std::size_t i = first; i <= last; ++i) {
    const Step& s = plan[i];
    const int g = base.mesh().size(s.mesh_dim);
    if (s.kind != StepKind::fill && s.kind != StepKind::scale) continue;
    const ReduceOp op = s.after[s.mesh_dim].reduce_op();
    if (s.kind == StepKind::fill && op == ReduceOp::avg) ops.multiply(dtype, out, count, g);
    if (s.kind == StepKind::scale && op == ReduceOp::sum && !scale_keeps_one(plan, op))
      ops.divide(dtype, out, count, g);
  }
}

// Whether local steps first..last (run_local_steps) may run with the block before them and the
// block after in one buffer on the rank at `me`: no element moves, as every one either keeps its
// value where it lies (the blocks are the same box, which every block between holds whole) or
// takes the op's identity (none is kept).
inline bool local_steps_in_place(const Plan& plan, std::size_t first, std::size_t last,
                                 const MeshCoord& me) {
  const Layout& base = plan.src();
  const Box have = base.local_box(plan[first].before, me);
  const Box want = base.local_box(plan[last].after, me);
  Box kept = intersect(have, want);
  for (std::size_t i = first; i <= last; ++i)
    kept = intersect(kept, base.local_box(plan[i].after, me));
  return kept.empty() || (have == want && kept == want);
}

// The context of step i of `plan` on the rank at `me`; with `messages`, run as point-to-point
// messages with exact pieces.
inline StepContext step_context(const Plan& plan, std::size_t i, const MeshCoord& me,
                                bool messages) {
  Step step = plan[i];
  if (messages) step.padded = false;
  StepContext c = context_at(plan, step, me);
  c.even = !messages && step_is_even(plan, step);
  c.messages = messages;
  return c;
}

// Where run_plan keeps the blocks between the steps of a plan on one rank, and the scratch that
// takes: the block after step i lives in the caller's target when bit i of `in_target` is set
// (it fits there, and the step before and the step after either use another buffer or run in
// place, runs_in_place), in scratch of its own size otherwise, allocated by the step that
// writes it and freed after the step that reads it, or, when bit i of `reuses` is set, in the
// scratch of the block before, which step i runs in place on. A step that neither reads nor
// writes the target may stage in it (StepContext::spare).
struct BlockPlacement {
  std::uint32_t in_target = 0;
  std::uint32_t reuses = 0;
  // Bit i set: step i, a chunk whose block is a slab of the block before (chunk_is_slab),
  // copies nothing; the next step reads that slab where it lies, in the source or in the block
  // before's scratch, which is freed after that step.
  std::uint32_t views = 0;
  // The most scratch held at once: the blocks in scratch around a step plus its staging.
  std::int64_t peak = 0;
};

// Whether step c, a chunk, keeps a slab of its block (slabs_along): the next step can read it
// where it lies.
inline bool chunk_is_slab(const StepContext& c) {
  return c.step.kind == StepKind::chunk &&
         (c.want.empty() || slabs_along(c.have.shape, c.step.after[c.step.mesh_dim].dim()));
}

// The placement with the least peak (ties: more blocks in the target), by dynamic programming
// over the steps with three states: the block after each step in scratch of its own, in the
// target, or a view (BlockPlacement::views) into the buffer of the block before it.
inline BlockPlacement place_blocks(const Plan& plan, const MeshCoord& me,
                                   std::uint32_t point_to_point, LinkAbilities a) {
  static_assert(max_plan_steps <= 32, "in_target has one bit per step");
  Stage stages[max_plan_steps];
  const std::size_t n = stages_of(plan, stages);
  const auto elem = static_cast<std::size_t>(plan.src().elem_bytes());
  const std::size_t target = bytes_of(plan.dst().local_box(me), elem);
  struct State {
    std::int64_t peak = 0;
    std::uint32_t in_target = 0, reuses = 0, views = 0;
    std::size_t held = 0;  // scratch the block before the next stage keeps (0: source, target)
    bool reachable = false;
  };
  // states[s]: the best placement so far with the block before this stage in scratch (0), in
  // the target (1) or viewed in the buffer of the block before it (2); the source is read in
  // place, as a scratch block of no bytes.
  enum { scratch = 0, in_target = 1, view = 2 };
  State states[3] = {{0, 0, 0, 0, 0, true}, {}, {}};
  for (std::size_t i = 0; i < n; ++i) {
    const Stage& stage = stages[i];
    StepContext c = step_context(plan, stage.last, me, (point_to_point >> stage.last & 1u) != 0);
    // Fused local steps stage nothing; in place where no element moves (local_steps_in_place).
    const bool fused = stage.first != stage.last;
    const bool last = i + 1 == n;
    const std::int64_t rows = fused ? 0 : band_rows(c, a, i == 0, last);  // 0: one call
    auto staging_of = [&](const StepContext& x) {
      return fused ? 0 : rows > 0 ? banded_staging(x, rows, a) : step_staging(x, a);
    };
    // A reduce-scatter (in rounds, or packed in its block) or an all-to-all (by peers, or
    // exact: into the own piece's slab) stages less where it may write its block
    // (block_writable: after the first stage, not a view, which may be of the source).
    const bool rounds =
        !fused && (c.step.kind == StepKind::all_to_all || c.step.kind == StepKind::reduce_scatter);
    auto staging_writable_of = [&](const StepContext& x) {
      StepContext w = x;
      w.block_writable = true;
      return staging_of(w);
    };
    const std::size_t staging = staging_of(c);
    const std::size_t staging_writable = rounds ? staging_writable_of(c) : staging;
    // Into the target (not in place): an exchange may stage past its block there (out_bytes).
    const std::size_t block = bytes_of(c.want, elem);
    StepContext into = c;
    into.out_bytes = target;
    const bool room_past = c.step.kind == StepKind::exchange && !fused && target > block;
    const std::size_t staging_into = room_past ? staging_of(into) : staging;
    const std::size_t staging_into_writable = room_past ? staging_into : staging_writable;
    const bool in_place = fused ? local_steps_in_place(plan, stage.first, stage.last, me)
                                : rows == 0 && runs_in_place(c, a);
    const std::size_t staging_in_place = in_place ? step_staging(c, a, true) : 0;
    c.spare_bytes = target;  // the target free during the stage: its room is spare
    const std::size_t staging_spare = staging_of(c);
    const std::size_t staging_spare_writable = rounds ? staging_writable_of(c) : staging_spare;
    const std::size_t staging_spare_in_place = in_place ? step_staging(c, a, true) : 0;
    const std::uint32_t bit = 1u << stage.last;
    State next[3] = {};
    auto consider = [&](int t, const State& from, std::size_t held, std::uint32_t reuse,
                        std::uint32_t viewed, std::size_t keeps) {
      const std::int64_t peak = std::max(from.peak, static_cast<std::int64_t>(held));
      if (!next[t].reachable || peak < next[t].peak)
        next[t] = {peak,
                   from.in_target | (t == in_target && !last ? bit : 0u),
                   from.reuses | reuse,
                   from.views | viewed,
                   keeps,
                   true};
    };
    for (int t : {in_target, scratch}) {  // the block after the stage
      if (last ? t == scratch : t == in_target && block > target) continue;
      for (int s : {scratch, in_target, view}) {
        if (!states[s].reachable || (s == in_target && t == in_target && !in_place)) continue;
        const bool w = i > 0 && s != view;
        const std::size_t held =
            states[s].held + (t == scratch ? block : 0) +
            (s == in_target ? t == in_target ? staging_in_place : staging_writable
             : t == scratch ? (w ? staging_spare_writable : staging_spare)
                            : (w ? staging_into_writable : staging_into));
        consider(t, states[s], held, 0, 0, t == scratch ? block : 0);
      }
      // In place in the scratch of the block before (not the source: i > 0), the target spare.
      if (t == scratch && !last && in_place && i > 0 && states[scratch].reachable &&
          states[scratch].held == block)
        consider(scratch, states[scratch], block + staging_spare_in_place, bit, 0, block);
    }
    // A slab kept where it lies, in the source or the block before's scratch (not the target:
    // the next step may write there).
    if (!last && !fused && chunk_is_slab(c))
      for (int s : {scratch, view})
        if (states[s].reachable) consider(view, states[s], states[s].held, 0, bit, states[s].held);
    states[scratch] = next[scratch];
    states[in_target] = next[in_target];
    states[view] = next[view];
  }
  const State& best = states[in_target];
  return {best.in_target, best.reuses, best.views, best.peak};
}

// One step (not fused) on its blocks: the bytes of staging it allocated.
template <class L, class Ops>
Task<std::size_t> run_step(L link, const Ops& ops, const StepContext& c, const std::byte* cur,
                           std::byte* out) {
  switch (c.step.kind) {
    case StepKind::identity:
    case StepKind::chunk:
      // An identity step's group is one rank: its block is unchanged.
      if (cur != out) copy_piece(ops, cur, c.have, out, c.want, c.want, c.elem);
      co_return 0;
    case StepKind::scale:
      if (cur != out) ops.copy(out, cur, bytes_of(c.want, c.elem));
      make_partial(ops, c, out);
      co_return 0;
    case StepKind::fill: fill_partial(ops, c, cur, out); co_return 0;
    case StepKind::all_gather: co_return co_await run_all_gather(link, ops, c, cur, out);
    case StepKind::reduce_scatter: co_return co_await run_reduce_scatter(link, ops, c, cur, out);
    case StepKind::all_reduce:
      if (c.messages) co_return co_await run_all_reduce_exact(link, ops, c, cur, out);
      if (all_reduces_by_messages(c, link_abilities(link)))
        co_return co_await run_all_reduce_by_messages(link, ops, c, cur, out);
      co_await link.all_reduce(c.step.mesh_dim, cur, out, static_cast<std::size_t>(c.have.numel()),
                               c.plan.src().dtype(), c.step.before[c.step.mesh_dim].reduce_op());
      co_return 0;
    case StepKind::all_to_all: co_return co_await run_all_to_all(link, ops, c, cur, out);
    case StepKind::exchange: co_return co_await run_exchange(link, ops, c, cur, out);
  }
  co_return 0;
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
  Stage stages[max_plan_steps];
  const std::size_t n = stages_of(plan, stages);
  const LinkAbilities abilities = link_abilities(link);
  const BlockPlacement placed =
      n > 1 ? place_blocks(plan, me, point_to_point, abilities) : BlockPlacement{};
  const std::uint32_t in_target = placed.in_target;
  const std::byte* cur = src;
  // The scratch blocks before and after the stage that runs (place_blocks).
  using Buffer = std::remove_cvref_t<decltype(ops.allocate(0))>;
  Buffer before, after;
  for (std::size_t stage = 0; stage < n; ++stage) {
    const std::size_t first = stages[stage].first, i = stages[stage].last;
    StepContext c = step_context(plan, i, me, (point_to_point >> i & 1u) != 0);
    // The block is scratch or the target after the first stage, unless a view (place_blocks).
    c.block_writable = stage > 0 && (placed.views >> stages[stage - 1].last & 1u) == 0;
    if ((placed.views >> i & 1u) != 0) {  // a slab of the block before, read where it lies
      if (!c.want.empty()) cur += slab_offset(c.want, c.have, elem);
      continue;
    }
    const std::int64_t rows_per_band =
        first == i ? band_rows(c, abilities, stage == 0, stage + 1 == n) : 0;
    // The target, unless this block goes to scratch; the step runs in place when its block is
    // in the target too, and may stage in the target when neither is.
    std::byte* out = dst;
    if (stage + 1 < n && (in_target >> i & 1u) == 0) {
      // In place in the block before's scratch, or in a scratch block of its own.
      if ((placed.reuses >> i & 1u) != 0) {
        after = std::move(before);
        before = Buffer{};
      } else {
        after = ops.allocate(bytes_of(c.want, elem));
      }
      out = after.data();
      if (stage == 0 || (in_target >> stages[stage - 1].last & 1u) == 0) {
        c.spare = dst;
        c.spare_bytes = bytes_of(plan.dst().local_box(me), elem);
      }
    } else {
      c.out_bytes = bytes_of(plan.dst().local_box(me), elem);
    }
    std::size_t staged = 0;
    if (first != i) {  // fused local steps
      run_local_steps(ops, plan, first, i, me, cur, out);
    } else if (rows_per_band > 0) {  // one collective per band of rows (band_rows)
      const std::int64_t rows = c.have.shape[0];
      for (std::int64_t r = 0; r < rows; r += rows_per_band) {
        const StepContext b = banded(c, r, std::min(rows_per_band, rows - r));
        staged = std::max(staged,
                          co_await run_step(link, ops, b, cur + slab_offset(b.have, c.have, elem),
                                            out + slab_offset(b.want, c.want, elem)));
      }
    } else {
      staged = co_await run_step(link, ops, c, cur, out);
    }
    if (scratch_peak != nullptr) {
      const auto held = static_cast<std::int64_t>(before.size() + after.size() + staged);
      *scratch_peak = std::max(*scratch_peak, held);
    }
    before = std::move(after);
    after = Buffer{};
    cur = out;
  }
}

}  // namespace dtensor::detail
