#pragma once

#include <cstdint>

#include "../cost_model.hpp"
#include "../layout.hpp"
#include "../plan.hpp"
#include "checked.hpp"
#include "partial_exchange.hpp"
#include "reduce_exchange.hpp"

// What one step costs one rank: the bytes it sends and receives, under the ring-algorithm
// convention of nccl-tests' bus bandwidth, and the cost model's time for them.
namespace dtensor::detail {

struct RankStepCost {
  RankBytes bytes;
  double us = 0;
  // A gather, reduce-scatter or all-to-all costed without padding: the messages the rank
  // receives when it runs as point-to-point messages (one per non-empty piece of another member).
  int exact_messages = 0;
};

constexpr std::int64_t max_of(std::int64_t a, std::int64_t b) noexcept { return a > b ? a : b; }

// Visits the coordinates of the mesh that agree with `base` on every dim where `fixed[k]` and,
// on the others, take every multiple of step[k] (BlockRelation::step), in row-major order,
// while `f` returns true.
template <class F>
constexpr void for_each_coord_while(const DeviceMesh& mesh, const MeshCoord& base,
                                    const bool* fixed, const int* step, F&& f) {
  MeshCoord c = base;
  for (int k = 0; k < mesh.ndim(); ++k)
    if (!fixed[k]) c[k] = 0;
  while (f(c)) {
    int k = mesh.ndim() - 1;
    for (; k >= 0; --k) {
      if (fixed[k]) continue;
      if ((c[k] += step[k]) < mesh.size(k)) break;
      c[k] = 0;
    }
    if (k < 0) return;
  }
}

// Steps that visit every coordinate.
inline constexpr int every_coord[max_mesh_dims] = {1, 1, 1, 1, 1, 1, 1, 1};

// As above, taking every value on the dims that are not fixed.
template <class F>
constexpr void for_each_coord_while(const DeviceMesh& mesh, const MeshCoord& base,
                                    const bool* fixed, F&& f) {
  for_each_coord_while(mesh, base, fixed, every_coord, f);
}

// How many coordinates for_each_coord_while visits: the product of the sizes of the mesh dims
// that are not fixed.
constexpr int visited_coords(const DeviceMesh& mesh, const bool* fixed) {
  int n = 1;
  for (int k = 0; k < mesh.ndim(); ++k) n *= fixed[k] ? 1 : mesh.size(k);
  return n;
}

// As for_each_coord_while, never stopping early.
template <class F>
constexpr void for_each_coord(const DeviceMesh& mesh, const MeshCoord& base, const bool* fixed,
                              F&& f) {
  for_each_coord_while(mesh, base, fixed, [&](const MeshCoord& c) {
    f(c);
    return true;
  });
}

// The outermost mesh dim where two coordinates differ (-1 when equal).
constexpr int outermost_difference(const MeshCoord& a, const MeshCoord& b) noexcept {
  for (std::size_t k = 0; k < a.size(); ++k)
    if (a[k] != b[k]) return static_cast<int>(k);
  return -1;
}

// The non-empty pieces of n elements cut into g under `policy`.
constexpr int nonempty_pieces(std::int64_t n, int g, ChunkPolicy policy) noexcept {
  if (n <= 0) return 0;
  if (policy == ChunkPolicy::balanced) return n < g ? static_cast<int>(n) : g;
  const std::int64_t piece = (n + g - 1) / g;
  return static_cast<int>((n + piece - 1) / piece);
}

// The piece of `n` elements cut into g (chunk_range) that holds element x (0 <= x < n).
constexpr int piece_holding(std::int64_t n, int g, ChunkPolicy policy, std::int64_t x) noexcept {
  if (policy == ChunkPolicy::balanced) {
    const std::int64_t base = n / g, extra = n % g;
    const std::int64_t wide = extra * (base + 1);  // the first `extra` pieces hold one more
    return static_cast<int>(x < wide ? x / (base + 1) : extra + (x - wide) / base);
  }
  return static_cast<int>(x / ((n + g - 1) / g));
}

// The non-empty pieces of `n` elements cut into g (chunk_range) that meet [lo, hi), a range
// within [0, n): they are consecutive, from the piece holding lo to the one holding hi - 1.
constexpr std::int64_t pieces_meeting_count(std::int64_t n, int g, ChunkPolicy policy,
                                            std::int64_t lo, std::int64_t hi) noexcept {
  if (hi <= lo) return 0;
  return piece_holding(n, g, policy, hi - 1) - piece_holding(n, g, policy, lo) + 1;
}

// The non-empty pieces [first, last) of `n` elements cut into g (chunk_range) that meet the
// relative range [lo, hi) (clipped to [0, n)): consecutive, from the piece holding its first
// element to the one holding its last (piece_holding), so a group of many members costs what a
// pair costs.
struct PieceSpan {
  int first = 0;
  int last = 0;
};
constexpr PieceSpan pieces_meeting(std::int64_t n, int g, ChunkPolicy policy, std::int64_t lo,
                                   std::int64_t hi) noexcept {
  if (lo < 0) lo = 0;
  if (hi > n) hi = n;
  if (hi <= lo) return {};
  return {piece_holding(n, g, policy, lo), piece_holding(n, g, policy, hi - 1) + 1};
}

// The sources of for_each_source_of from mesh dim `k` on, inside `outer` (the block cut by the
// shards of the mesh dims before k, at `source`'s coordinates there; cut further while visiting,
// restored after): on a shard dim only the pieces that meet `want` (pieces_meeting), so a rank's
// pieces cost their number, not the mesh's size. Recursion: one level per mesh dim.
template <class F>
// NOLINTNEXTLINE(misc-no-recursion): bounded by the mesh's dims, see above
constexpr void visit_sources(const Layout& base, const Placements& before, const Box& want, int k,
                             MeshCoord& source, Box& outer, F& f) {
  const DeviceMesh& mesh = base.mesh();
  while (k < mesh.ndim() && !before[k].is_shard()) ++k;
  if (k == mesh.ndim()) {
    const Box piece = intersect(want, outer);
    if (!piece.empty()) f(static_cast<const MeshCoord&>(source), piece);
    return;
  }
  const auto d = static_cast<std::size_t>(before[k].dim());
  const int g = mesh.size(k);
  const std::int64_t start = outer.offset[d], n = outer.shape[d];
  const std::int64_t lo = want.offset[d], hi = want.offset[d] + want.shape[d];
  const PieceSpan span = pieces_meeting(n, g, base.policy(), lo - start, hi - start);
  for (int j = span.first; j < span.last; ++j) {
    const Range r = chunk_range(n, g, j, base.policy());
    if (r.size == 0 || start + r.start >= hi || start + r.start + r.size <= lo) continue;
    outer.offset[d] = start + r.start;
    outer.shape[d] = r.size;
    source[static_cast<std::size_t>(k)] = j;
    visit_sources(base, before, want, k + 1, source, outer, f);
  }
  outer.offset[d] = start;  // as the caller's
  outer.shape[d] = n;
}

// f(source, piece) for every source block (placements `before`) that meets `want`, among the
// holders whose coordinates on the non-shard dims of `before` are the receiver's (a replica next
// to it): the sources an exchange takes `want` from, in row-major order.
template <class F>
constexpr void for_each_source_of(const Layout& base, const Placements& before, const Box& want,
                                  const MeshCoord& receiver, F&& f) {
  if (want.empty()) return;
  MeshCoord source = receiver;
  Box whole;
  whole.shape = base.global_shape();
  whole.offset.resize(whole.shape.size(), 0);
  visit_sources(base, before, want, 0, source, whole, f);
}

// The pieces the rank at `receiver` gets from others in an exchange into a Partial, given the
// boxes it receives (owned_part): f(source, piece) for every source block that meets one
// (for_each_source_of).
template <class F>
constexpr void for_each_received_piece(const Layout& base, const Placements& before,
                                       const BoxList& received, const MeshCoord& receiver, F&& f) {
  for (const Box& want : received) for_each_source_of(base, before, want, receiver, f);
}

// An exchange moves, to each rank r, the part of its target block it lacks. It receives each
// source tile from the holder whose coordinates on the source's non-shard dims equal r's (a
// replica next to it), so each rank receives exactly |dst(r)| - |dst(r) ∩ src(r)| elements.
// `f(source_coord, piece)` is called for every source with a non-empty piece, r's own included.
template <class F>
constexpr void for_each_exchange_source(const Layout& base, const Placements& before,
                                        const Placements& after, const MeshCoord& receiver, F&& f) {
  if (makes_partial(before, after)) {
    // Into a Partial: the receiver's own part of its group's block (owned_part).
    const OwnedPart part = owned_part(base, before, after, receiver);
    for (const Box& kept : part.held) f(receiver, kept);
    for_each_received_piece(base, before, part.received, receiver, f);
    return;
  }
  for_each_source_of(base, before, base.local_box(after, receiver), receiver, f);
}

// The ranks an exchange sends to from `sender`, with the piece each gets (the sender's own
// piece included): every receiver that picks `sender` as its source.
template <class F>
constexpr void for_each_exchange_target(const Layout& base, const Placements& before,
                                        const Placements& after, const MeshCoord& sender, F&& f) {
  const DeviceMesh& mesh = base.mesh();
  bool fixed[max_mesh_dims] = {};
  for (int k = 0; k < mesh.ndim(); ++k) fixed[k] = !before[k].is_shard();
  const Box have = base.local_box(before, sender);
  if (have.empty()) return;
  if (makes_partial(before, after)) {
    // Into a Partial: each receiver's own part of its group's block (owned_part), in its order.
    for_each_coord(mesh, sender, fixed, [&](const MeshCoord& receiver) {
      const OwnedPart part = owned_part(base, before, after, receiver);
      if (receiver == sender) {
        for (const Box& kept : part.held) f(receiver, kept);
        return;
      }
      for (const Box& want : part.received) {
        const Box piece = intersect(have, want);
        if (!piece.empty()) f(receiver, piece);
      }
    });
    return;
  }
  for_each_coord(mesh, sender, fixed, [&](const MeshCoord& receiver) {
    const Box piece = intersect(have, base.local_box(after, receiver));
    if (!piece.empty()) f(receiver, piece);
  });
}

// The number of pieces that tensor dim d of `range` is cut into by the shards of mesh dims from
// `depth` on, counting only non-empty pieces that overlap `want` (both ranges of dim d).
// Depth-first over the nesting: the recursion is at most 8 deep (one level per mesh dim).
// NOLINTNEXTLINE(misc-no-recursion): bounded by the mesh's dims, see above
constexpr std::int64_t pieces_overlapping(const Layout& base, const Placements& ps, int depth,
                                          int d, Range range, Range want) {
  int next = depth;
  while (next < base.mesh().ndim() && !ps[next].is_shard(d)) ++next;
  const std::int64_t lo = range.start > want.start ? range.start : want.start;
  const std::int64_t hi_a = range.start + range.size, hi_b = want.start + want.size;
  const std::int64_t hi = hi_a < hi_b ? hi_a : hi_b;
  if (hi <= lo || range.size == 0) return 0;
  if (next == base.mesh().ndim()) return 1;
  // Cut evenly from here on, the pieces are equal: count those [lo, hi) meets.
  std::int64_t parts = 1;
  for (int m = next; m < base.mesh().ndim(); ++m)
    if (ps[m].is_shard(d)) parts *= base.mesh().size(m);
  if (range.size % parts == 0) {
    const std::int64_t piece = range.size / parts;
    return (hi - 1 - range.start) / piece - (lo - range.start) / piece + 1;
  }
  std::int64_t count = 0;
  const int g = base.mesh().size(next);
  const PieceSpan span = pieces_meeting(range.size, g, base.policy(), want.start - range.start,
                                        want.start + want.size - range.start);
  // The last cut: each piece of the span meets the range and counts once.
  if (parts == g) return span.last - span.first;
  for (int j = span.first; j < span.last; ++j) {
    const Range r = chunk_range(range.size, g, j, base.policy());
    count += pieces_overlapping(base, ps, next + 1, d, {range.start + r.start, r.size}, want);
  }
  return count;
}

// The elements of range `have` of tensor dim d inside the pieces that the shards of `ps` from
// mesh dim `depth` on cut `range` into, summed over the coordinates on the mesh dims in `vary`
// (a bit set; the others are `coord`'s): the pieces are disjoint, so this is how much of `have`
// those ranks' blocks of dim d hold together. Recursion as pieces_overlapping.
// NOLINTNEXTLINE(misc-no-recursion): bounded by the mesh's dims, see above
constexpr std::int64_t overlap_over(const Layout& base, const Placements& ps,
                                    const MeshCoord& coord, unsigned vary, int depth, int d,
                                    Range range, Range have) {
  const int n = base.mesh().ndim();
  int next = depth;
  while (next < n && !ps[next].is_shard(d)) ++next;
  // Where every cut from here on varies, the pieces tile `range`: their overlaps with `have` sum
  // to the range's own.
  bool every_cut_varies = true;
  for (int m = next; m < n && every_cut_varies; ++m)
    every_cut_varies = !ps[m].is_shard(d) || (vary >> m & 1u) != 0;
  if (every_cut_varies) return overlap_size(range, have);
  const int g = base.mesh().shape()[static_cast<std::size_t>(next)];
  if ((vary >> next & 1u) == 0) {
    const Range r = chunk_range(range.size, g, coord[next], base.policy());
    return overlap_over(base, ps, coord, vary, next + 1, d, {range.start + r.start, r.size}, have);
  }
  std::int64_t total = 0;
  const PieceSpan span = pieces_meeting(range.size, g, base.policy(), have.start - range.start,
                                        have.start + have.size - range.start);
  for (int j = span.first; j < span.last; ++j) {
    const Range r = chunk_range(range.size, g, j, base.policy());
    total +=
        overlap_over(base, ps, coord, vary, next + 1, d, {range.start + r.start, r.size}, have);
  }
  return total;
}

struct ExchangeCost {
  std::int64_t send = 0;  // elements
  std::int64_t recv = 0;  // elements
  double us = 0;
  double first_round_us = 0;  // of `us`, an exchange from a Partial's first round
};

// A rank's point-to-point receives in one round, by the link class of each message (the
// outermost mesh dim where sender and receiver differ).
struct ReceivesByLink {
  std::int64_t elements[max_mesh_dims] = {};
  std::int64_t messages[max_mesh_dims] = {};

  constexpr void add(int k, std::int64_t n) {
    elements[k] += n;
    ++messages[k];
  }
  // Adds the elements to out.recv and their time, one round's, to out.us.
  constexpr void price(const Layout& base, const CostModel& cost, ExchangeCost& out) const {
    for (int k = 0; k < base.mesh().ndim(); ++k) {
      if (elements[k] == 0) continue;
      out.recv += elements[k];
      out.us += cost.dims[k].time_us(cost.p2p_latency_factor * double(messages[k]),
                                     double(elements[k]) * double(base.elem_bytes()));
    }
  }
};

// f(k, elements, messages) for each link class k (mesh dim) over which the rank at `coord`
// receives some of `want` from the source blocks (placements `before`) that for_each_source_of
// visits, one message per block that meets it, found without visiting them: the sources that first
// differ from it on mesh dim k hold the part of `want` inside box V_k but outside V_(k+1), where
// V_k is cut by the source's shards of mesh dims before k (V_0 is the tensor, V_n its own block,
// which it does not receive). Boxes are products of ranges, so both counts are products over tensor
// dims, and a cut by mesh dim k changes one factor: O(mesh dims) per box.
template <class F>
constexpr void for_each_source_class(const Layout& base, const Placements& before, const Box& want,
                                     const MeshCoord& coord, F&& f) {
  if (want.empty()) return;
  const DeviceMesh& mesh = base.mesh();
  const int n = mesh.ndim();
  const int nd = base.tensor_ndim();
  // Per tensor dim: V_k's range, the part of it inside `want`, and the pieces of it that the
  // shards of mesh dims from k on cut and that overlap `want`.
  Range v[max_tensor_dims] = {};
  std::int64_t inside_d[max_tensor_dims] = {}, tiles_d[max_tensor_dims] = {};
  std::int64_t inside_prev = want.numel();  // |want ∩ V_0|
  std::int64_t tiles_prev = 1;
  for (int d = 0; d < nd; ++d) {
    v[d] = {0, base.global_shape()[d]};
    inside_d[d] = want.shape[d];
    tiles_d[d] = pieces_overlapping(base, before, 0, d, v[d], {want.offset[d], want.shape[d]});
    tiles_prev *= tiles_d[d];
  }
  for (int k = 0; k < n; ++k) {
    const Placement& p = before[k];
    if (!p.is_shard()) continue;  // V_(k+1) is V_k: nothing comes from across mesh dim k
    const int d = p.dim();
    const Range r =
        chunk_range(v[d].size, mesh.shape()[static_cast<std::size_t>(k)], coord[k], base.policy());
    v[d] = {v[d].start + r.start, r.size};
    inside_d[d] = overlap_size(v[d], {want.offset[d], want.shape[d]});
    tiles_d[d] = pieces_overlapping(base, before, k + 1, d, v[d], {want.offset[d], want.shape[d]});
    std::int64_t inside = 1, tiles = 1;
    for (int e = 0; e < nd; ++e) {
      inside *= inside_d[e];
      tiles *= tiles_d[e];
    }
    if (inside_prev > inside) f(k, inside_prev - inside, tiles_prev - tiles);
    inside_prev = inside;
    tiles_prev = tiles;
  }
}

// Adds to `in` the receives for_each_source_class finds.
constexpr void add_source_receives(const Layout& base, const Placements& before, const Box& want,
                                   const MeshCoord& coord, ReceivesByLink& in) {
  for_each_source_class(base, before, want, coord,
                        [&](int k, std::int64_t elements, std::int64_t messages) {
                          in.elements[k] += elements;
                          in.messages[k] += messages;
                        });
}

// An exchange, seen from the rank at `coord` (see for_each_exchange_source): it receives what
// its target block lacks from its own (for_each_source_class), each link class in one round.
// `have` and `want` are the rank's blocks before and after.
constexpr ExchangeCost exchange_cost(const Layout& base, const Placements& before,
                                     const Placements& after, const MeshCoord& coord,
                                     const Box& have, const Box& want, const CostModel& cost) {
  ExchangeCost out;
  const DeviceMesh& mesh = base.mesh();
  const int n = mesh.ndim();
  const int nd = base.tensor_ndim();
  for (const std::size_t size : {before.size(), after.size(), coord.size()})
    if (size < static_cast<std::size_t>(n)) fail<why::index_out_of_range>(n - 1, size);
  for_each_source_class(
      base, before, want, coord, [&](int k, std::int64_t elements, std::int64_t messages) {
        out.recv += elements;
        out.us += cost.dims[k].time_us(cost.p2p_latency_factor * double(messages),
                                       double(elements) * double(base.elem_bytes()));
      });
  // Sends: to every receiver that picks this rank, the part of its block this rank holds. The
  // receivers vary on the source's shard dims; those that do not shard in the target get
  // copies of the same block, the others cut disjoint pieces of each tensor dim.
  if (!have.empty()) {
    unsigned vary = 0;
    std::int64_t copies = 1;
    for (int k = 0; k < n; ++k) {
      if (before[k].is_shard() && after[k].is_shard()) vary |= 1u << k;
      if (before[k].is_shard() && !after[k].is_shard())
        copies *= mesh.shape()[static_cast<std::size_t>(k)];
    }
    std::int64_t total = 1;
    for (int d = 0; d < nd && total != 0; ++d)
      total *= overlap_over(base, after, coord, vary, 0, d, {0, base.global_shape()[d]},
                            {have.offset[d], have.shape[d]});
    out.send = bytes_mul(total, copies) - overlap_numel(have, want);
  }
  return out;
}

// The fastest link of the mesh dims `dims` (bits) of more than one rank: the least latency and
// the most bandwidth among them ({1e300, 0} when there is none).
constexpr LinkCost fastest_link(const DeviceMesh& mesh, const CostModel& cost,
                                unsigned dims = ~0u) {
  LinkCost fastest{1e300, 0};
  for (int k = 0; k < mesh.ndim(); ++k) {
    if (mesh.size(k) == 1 || (dims >> k & 1u) == 0) continue;
    const LinkCost& link = cost.dims[k];
    if (link.latency_us < fastest.latency_us) fastest.latency_us = link.latency_us;
    if (link.bandwidth_gbs > fastest.bandwidth_gbs) fastest.bandwidth_gbs = link.bandwidth_gbs;
  }
  return fastest;
}

// The fastest link of the mesh dims `dims` (fastest_link) as a point-to-point message pays it:
// its latency times the model's p2p_latency_factor. A floor under any message of an exchange
// over those dims.
constexpr LinkCost fastest_p2p_link(const DeviceMesh& mesh, const CostModel& cost,
                                    unsigned dims = ~0u) {
  const LinkCost fastest = fastest_link(mesh, cost, dims);
  return {fastest.latency_us * cost.p2p_latency_factor, fastest.bandwidth_gbs};
}

// The least multiple of a link's latency that any message pays: 1 in a collective, the model's
// p2p_latency_factor in a point-to-point round, whichever is less.
constexpr double least_latency_factor(const CostModel& cost) noexcept {
  return cost.p2p_latency_factor < 1 ? cost.p2p_latency_factor : 1;
}

// The receives of the rank at `receiver` in an exchange into a Partial, given the boxes it
// receives (owned_part): one message per source block that meets one, priced by the link of the
// outermost mesh dim where the source's coordinates differ from its own. f(source, piece) sees
// each piece (for_each_received_piece).
template <class F>
constexpr ExchangeCost partial_receives(const Layout& base, const Placements& before,
                                        const BoxList& received, const MeshCoord& receiver,
                                        const CostModel& cost, F&& f) {
  ReceivesByLink in;
  for_each_received_piece(base, before, received, receiver,
                          [&](const MeshCoord& source, const Box& piece) {
                            in.add(outermost_difference(source, receiver), piece.numel());
                            f(source, piece);
                          });
  ExchangeCost out;
  in.price(base, cost, out);
  return out;
}

// The same without seeing the pieces: on more than 8 ranks counted per box without visiting the
// blocks (add_source_receives); on fewer, where a box meets a few blocks, visiting them costs
// less.
constexpr ExchangeCost partial_receives(const Layout& base, const Placements& before,
                                        const BoxList& received, const MeshCoord& receiver,
                                        const CostModel& cost) {
  if (base.mesh().size() <= 8)
    return partial_receives(base, before, received, receiver, cost,
                            [](const MeshCoord&, const Box&) {});
  ReceivesByLink in;
  for (const Box& want : received) add_source_receives(base, before, want, receiver, in);
  ExchangeCost out;
  in.price(base, cost, out);
  return out;
}

// An exchange into a Partial (owned_part), seen from the rank at `coord`: its receives
// (partial_receives) and, with `sends`, the elements it sends (which visits every receiver's
// part).
constexpr ExchangeCost partial_exchange_cost(const Layout& base, const Placements& before,
                                             const Placements& after, const MeshCoord& coord,
                                             const CostModel& cost, bool sends = true) {
  ExchangeCost out =
      partial_receives(base, before, owned_part(base, before, after, coord).received, coord, cost);
  if (sends)
    for_each_exchange_target(base, before, after, coord,
                             [&](const MeshCoord& receiver, const Box& piece) {
                               if (!(receiver == coord)) out.send += piece.numel();
                             });
  return out;
}

// Every rank's figures for one exchange into a Partial (partial_exchange_costs), by the rank's
// index in the mesh. No initializers: a plan without such a step leaves them unwritten, unread.
struct RankExchangeCosts {
  std::int64_t send[max_partial_exchange_ranks];  // elements
  std::int64_t recv[max_partial_exchange_ranks];  // elements
  double us[max_partial_exchange_ranks];
};

// As partial_exchange_cost, for every rank at once: each group's unheld boxes found once
// (group_unheld), each rank's receives counted once (partial_receives) and, with `sends`, its
// pieces visited once and counted on both ends (sends 0 without). False when the mesh has more than
// max_partial_exchange_ranks ranks or some part does not fit owned_part's boxes, and as soon as a
// rank is known to take more than `us_limit` or to receive more than `recv_limit` elements (a
// plan with it cannot win).
constexpr bool partial_exchange_costs(const Layout& base, const Placements& before,
                                      const Placements& after, const CostModel& cost,
                                      RankExchangeCosts& out, double us_limit = 1e300,
                                      std::int64_t recv_limit = INT64_MAX, bool sends = true) {
  const DeviceMesh& mesh = base.mesh();
  const int ranks = mesh.size();
  if (ranks > max_partial_exchange_ranks) return false;
  unsigned made = 0;
  made_partial_op(before, after, &made);
  const int g = group_size(mesh, made);
  for (int i = 0; i < ranks; ++i) out.send[i] = 0;
  for (int i = 0; i < ranks; ++i) {
    const MeshCoord first = mesh.coordinate_at(i);
    if (group_index(mesh, first, made) != 0) continue;
    const GroupUnheld group = group_unheld(base, before, after, first);
    if (!group.ok) return false;
    for (int j = 0; j < g; ++j) {
      const MeshCoord receiver = group_member(mesh, first, made, j);
      BoxList received;
      if (group.members > 0 && !append_share(group, j, received)) return false;
      // With the sends, the pieces are visited anyway: the receives are counted on the way.
      const ExchangeCost mine =
          sends ? partial_receives(base, before, received, receiver, cost,
                                   [&](const MeshCoord& source, const Box& piece) {
                                     out.send[mesh.index(source)] += piece.numel();
                                   })
                : partial_receives(base, before, received, receiver, cost);
      const int at = mesh.index(receiver);
      out.recv[at] = mine.recv;
      out.us[at] = mine.us;
      if (mine.us > us_limit || mine.recv > recv_limit) return false;
    }
  }
  return true;
}

// The first round of an exchange from a Partial at a member whose part has `n` elements: its
// partial from every other member of its group (on the mesh dims `dims`). The same at every
// member: on each of those dims, (size - 1) times the members of the group's dims inside it
// differ from it first (outermost) there.
constexpr ReceivesByLink first_round_receives(const DeviceMesh& mesh, unsigned dims,
                                              std::int64_t n) {
  ReceivesByLink in;
  if (n == 0) return in;
  std::int64_t inner = 1;
  for (int k = mesh.ndim(); k-- > 0;) {
    if ((dims >> k & 1U) == 0) continue;
    const std::int64_t others = (mesh.size(k) - 1) * inner;
    in.elements[k] = n * others;
    in.messages[k] = others;
    inner *= mesh.size(k);
  }
  return in;
}

// The owners the rank at `receiver` takes its target block from in an exchange from a Partial
// (reduce_exchange.hpp; `dims` the reduced mesh dims): f(owner, piece) for every part that meets
// the block, its own included, in the groups whose coordinates on the Replicate dims of
// `before` and on the Partials it keeps are the receiver's. `by_elements` as group_parts; `own`,
// when given, is the parts of the receiver's group. A part of several boxes gives a piece per box
// that meets the block.
template <class F>
constexpr void for_each_owner(const Layout& base, const Placements& before, const Placements& after,
                              unsigned dims, bool by_elements, const MeshCoord& receiver, F&& f,
                              const GroupParts* own = nullptr) {
  const DeviceMesh& mesh = base.mesh();
  const Box want = base.local_box(after, receiver);
  // The groups whose block meets the target block: the sources of for_each_source_of (the
  // member at the receiver's coordinates on the reduced dims).
  for_each_source_of(base, before, want, receiver, [&](const MeshCoord& group, const Box&) {
    const GroupParts parts = own != nullptr && group == receiver
                                 ? *own
                                 : group_parts(base, before, after, dims, group, by_elements);
    for (int j = 0; j < parts.members; ++j)
      for (const Box& box : parts.part_boxes(j)) {
        const Box piece = intersect(want, box);
        if (!piece.empty()) f(group_member(mesh, group, dims, j), piece);
      }
  });
}

// The ranks the owner at `sender` sends to in an exchange from a Partial, with the piece each
// gets, its own included: every receiver that takes from its group (for_each_owner), a piece per
// box of the sender's part (`part`, GroupParts::part_boxes) that meets its block.
template <class F>
constexpr void for_each_owned_target(const Layout& base, const Placements& before,
                                     const Placements& after, const RunBoxes& part,
                                     const MeshCoord& sender, F&& f) {
  if (part.empty()) return;
  const DeviceMesh& mesh = base.mesh();
  bool fixed[max_mesh_dims] = {};
  // The receivers share the sender's coordinates on the Replicate dims and on the kept Partials.
  for (int k = 0; k < mesh.ndim(); ++k)
    fixed[k] = before[k].is_replicate() || after[k].is_partial();
  for_each_coord(mesh, sender, fixed, [&](const MeshCoord& receiver) {
    const Box want = base.local_box(after, receiver);
    for (const Box& box : part) {
      const Box piece = intersect(box, want);
      if (!piece.empty()) f(receiver, piece);
    }
  });
}

// An exchange from a Partial seen from the rank at `coord`: both rounds' receives (each
// member's partial of its part from every other member; then the pieces of its target block it
// does not own), their times added, and with `sends` the elements it sends in both. `group`,
// when given, is the parts of its group, cut as `by_elements` says (group_parts).
constexpr ExchangeCost reducing_exchange_cost(const Layout& base, const Placements& before,
                                              const Placements& after, const MeshCoord& coord,
                                              const CostModel& cost, bool sends = true,
                                              const GroupParts* group = nullptr,
                                              bool by_elements = false) {
  const DeviceMesh& mesh = base.mesh();
  const unsigned dims = reduced_partials(before, after).dims;
  const GroupParts parts =
      group != nullptr ? *group : group_parts(base, before, after, dims, coord, by_elements);
  const int me = group_index(mesh, coord, dims);
  const std::int64_t own = parts.part_numel(me);
  ExchangeCost out;
  first_round_receives(mesh, dims, own).price(base, cost, out);
  out.first_round_us = out.us;
  ReceivesByLink deliver;
  for_each_owner(
      base, before, after, dims, by_elements, coord,
      [&](const MeshCoord& owner, const Box& piece) {
        if (!(owner == coord)) deliver.add(outermost_difference(owner, coord), piece.numel());
      },
      &parts);
  deliver.price(base, cost, out);
  if (sends) {
    out.send = parts.block.numel() - own;
    for_each_owned_target(base, before, after, parts.part_boxes(me), coord,
                          [&](const MeshCoord& receiver, const Box& piece) {
                            if (!(receiver == coord)) out.send += piece.numel();
                          });
  }
  return out;
}

// Floors under the two rounds of an exchange from a Partial, from the group of `coord` alone:
// its slowest first round exactly (each member receives every other member's partial of its
// part), and under its slowest second round, what each member lacks of its target block in one
// message at least from each other member whose part holds some of it and one from the other
// groups (the rest), at best over the fastest of the links between members, and of all (a
// round's time is a sum over link classes of latency per message plus bytes over bandwidth, so
// no split of the messages and bytes among the links costs less). Without `cut`, lower ones
// that do not cut the group's block: the member with the largest part (at least 1/g of the
// block) receives g-1 messages of it, and `coord` what of its target block its group's block
// lacks, in `other_groups` messages (at least one; the caller may know how many other groups
// hold some of it: missing_elements counts them). `own`, when given with `cut`, is the parts of
// the group of `coord` (a cut by elements is given so; without it, the cut along a dim is
// found).
struct RoundFloors {
  double first = 0;
  double second = 0;
};

// What the floors that do not cut the group's block of `coord` read, in an exchange from a
// Partial: the group's size, the least size of its largest part (1/g of the block), and how
// many elements of the target block of `coord` the group's block lacks.
struct UncutShares {
  int g = 1;
  std::int64_t part = 0;
  std::int64_t from_others = 0;
};

constexpr UncutShares uncut_shares(const Layout& base, const Placements& before,
                                   const Placements& after, const MeshCoord& coord) {
  UncutShares out;
  const Box block = base.local_box(before, coord), want = base.local_box(after, coord);
  out.g = group_size(base.mesh(), reduced_partials(before, after).dims);
  out.part = (block.numel() + out.g - 1) / out.g;
  out.from_others = want.numel() - overlap_numel(want, block);
  return out;
}

constexpr RoundFloors reducing_exchange_floors(const Layout& base, const Placements& before,
                                               const Placements& after, const MeshCoord& coord,
                                               const CostModel& cost, bool cut,
                                               const GroupParts* own = nullptr,
                                               std::int64_t other_groups = 1) {
  const DeviceMesh& mesh = base.mesh();
  const unsigned dims = reduced_partials(before, after).dims;
  const LinkCost inside = fastest_p2p_link(mesh, cost, dims), any = fastest_p2p_link(mesh, cost);
  const auto elem = static_cast<double>(base.elem_bytes());
  RoundFloors out;
  if (!cut) {
    const UncutShares u = uncut_shares(base, before, after, coord);
    if (u.part > 0 && u.g > 1)
      out.first = inside.time_us(u.g - 1, double(u.part) * (u.g - 1) * elem);
    if (u.from_others > 0)
      out.second =
          any.time_us(double(other_groups > 1 ? other_groups : 1), double(u.from_others) * elem);
    return out;
  }
  const GroupParts parts = own != nullptr ? *own : group_parts(base, before, after, dims, coord);
  const auto g = static_cast<std::size_t>(parts.members);
  static_vector<Box, max_reducing_group> wants;
  for (std::size_t j = 0; j < g; ++j) {
    const MeshCoord member = group_member(mesh, coord, dims, static_cast<int>(j));
    ExchangeCost e;
    first_round_receives(mesh, dims, parts.part_numel(static_cast<int>(j))).price(base, cost, e);
    out.first = e.us > out.first ? e.us : out.first;
    wants.push_back(base.local_box(after, member));
  }
  // From the group: one message at least from each other member whose part meets a member's
  // target block (other_parts_in).
  int non_empty[max_reducing_group + 1];  // NOLINT(cppcoreguidelines-pro-type-member-init)
  non_empty_ranges(parts, non_empty);
  for (std::size_t j = 0; j < g; ++j) {
    const OtherParts from_group = other_parts_in(parts, non_empty, wants[j], static_cast<int>(j));
    const std::int64_t from_others = wants[j].numel() - overlap_numel(wants[j], parts.block);
    double us = 0;
    if (from_group.elements > 0)
      us += inside.time_us(from_group.parts, double(from_group.elements) * elem);
    if (from_others > 0) us += any.time_us(1, double(from_others) * elem);
    out.second = us > out.second ? us : out.second;
  }
  return out;
}

// A floor under the most elements a rank receives in an exchange from a Partial, from the group
// of `coord` without cutting its block: the member with the largest part (at least 1/g of the
// block) receives g-1 partials of it, and `coord` what of its target block its group's block
// lacks.
constexpr std::int64_t reducing_exchange_elements_floor(const Layout& base,
                                                        const Placements& before,
                                                        const Placements& after,
                                                        const MeshCoord& coord) {
  const UncutShares u = uncut_shares(base, before, after, coord);
  const std::int64_t first = bytes_mul(u.g - 1, u.part);
  return first > u.from_others ? first : u.from_others;
}

// A floor under the slowest second round of an exchange from a Partial, from the targets of the
// group of `coord` without cutting its block: each element of the block is owned by one member,
// so of the t members whose target blocks hold it, t - 1 at least lack it, and some member lacks
// at least the targets' excess over the block (their sum inside it less its size) over g, in one
// message at least, at best over the fastest link.
constexpr double shared_targets_floor(const Layout& base, const Placements& before,
                                      const Placements& after, const MeshCoord& coord,
                                      const CostModel& cost) {
  const DeviceMesh& mesh = base.mesh();
  const unsigned dims = reduced_partials(before, after).dims;
  const int g = group_size(mesh, dims);
  const Box block = base.local_box(before, coord);
  std::int64_t excess = -block.numel();
  for (int j = 0; j < g; ++j)
    excess += overlap_numel(base.local_box(after, group_member(mesh, coord, dims, j)), block);
  if (excess <= 0) return 0;
  const std::int64_t lacks = (excess + g - 1) / g;  // the busiest member's, at least
  return fastest_p2p_link(mesh, cost).time_us(1, double(lacks) * double(base.elem_bytes()));
}

// The floors of reducing_exchange_floors without `cut` for every rank: the largest of each
// round's (together a floor under the step's time, the slowest first round then the slowest
// second), and a rank whose second round's is the largest (the first in row-major order).
struct SlowestFloors {
  RoundFloors floors;
  MeshCoord at;
};

constexpr SlowestFloors slowest_quick_floors(const Layout& base, const Placements& before,
                                             const Placements& after, const CostModel& cost) {
  const DeviceMesh& mesh = base.mesh();
  SlowestFloors out{{-1, -1}, {}};
  for (int i = 0; i < mesh.size(); ++i) {
    const MeshCoord c = mesh.coordinate_at(i);
    const RoundFloors f = reducing_exchange_floors(base, before, after, c, cost, false);
    out.floors.first = f.first > out.floors.first ? f.first : out.floors.first;
    if (f.second > out.floors.second) {
      out.floors.second = f.second;
      out.at = c;
    }
  }
  return out;
}

// As reducing_exchange_cost, for every rank at once (each group's parts cut once, each rank's
// owners found among the groups whose block meets its target), with the step's time, the
// slowest rank's first round then the slowest's second, as every rank's. False when the mesh has
// more than max_partial_exchange_ranks ranks or a group more than max_reducing_group members,
// and as soon as the step is known to take more than `us_limit` or a rank to receive more than
// `recv_limit` elements (a plan with it cannot win). `by_elements` as group_parts.
constexpr bool reducing_exchange_costs(const Layout& base, const Placements& before,
                                       const Placements& after, const CostModel& cost,
                                       RankExchangeCosts& out, double us_limit = 1e300,
                                       std::int64_t recv_limit = INT64_MAX,
                                       bool by_elements = false) {
  const DeviceMesh& mesh = base.mesh();
  const int ranks = mesh.size();
  const unsigned dims = reduced_partials(before, after).dims;
  const int g = group_size(mesh, dims);
  if (ranks > max_partial_exchange_ranks || g > max_reducing_group) return false;
  // Each rank's part: a range of one tensor dim of its group's block, or (dim -1-k) of its
  // elements in the order with tensor dim k outermost (GroupParts::outer). Written for every rank
  // below (each is a member of one group) before it is read: not cleared, since clearing the whole
  // table costs more than the rest of a small mesh's costing.
  struct Part {
    std::int64_t lo, hi;
    int dim;
  };
  Part part[max_partial_exchange_ranks];  // NOLINT(cppcoreguidelines-pro-type-member-init)
  // The slowest first round first, then the second rounds rank by rank against the limit.
  double first = 0, second = 0;
  for (int i = 0; i < ranks; ++i) {
    const MeshCoord c = mesh.coordinate_at(i);
    if (group_index(mesh, c, dims) != 0) continue;
    const GroupParts parts = group_parts(base, before, after, dims, c, by_elements);
    for (int j = 0; j < parts.members; ++j) {
      const MeshCoord member = group_member(mesh, c, dims, j);
      const int at = mesh.index(member);
      if (parts.by_elements) {
        part[at] =
            Part{parts.part_first(j), parts.part_first(j) + parts.part_numel(j), -1 - parts.outer};
      } else {
        const Box mine = parts.part(j);
        part[at] = mine.shape.empty()
                       ? Part{0, 0, 0}
                       : Part{mine.offset[parts.dim],
                              mine.offset[parts.dim] + mine.shape[parts.dim], parts.dim};
      }
      const std::int64_t n = parts.part_numel(j);
      out.send[at] = parts.block.numel() - n;
      ExchangeCost e;
      first_round_receives(mesh, dims, n).price(base, cost, e);
      first = e.us > first ? e.us : first;
      out.recv[at] = e.recv;
    }
  }
  for (int i = 0; i < ranks; ++i) {
    const MeshCoord receiver = mesh.coordinate_at(i);
    ExchangeCost mine;
    mine.recv = out.recv[i];
    ReceivesByLink deliver;
    // The owners of the groups whose block meets the target block (for_each_owner), from the
    // parts found above.
    for_each_source_of(base, before, base.local_box(after, receiver), receiver,
                       [&](const MeshCoord& group, const Box& piece) {
                         Box block;  // the group's, where a part is a run of its elements
                         for (int j = 0; j < g; ++j) {
                           const MeshCoord owner = group_member(mesh, group, dims, j);
                           if (owner == receiver) continue;
                           const int at = mesh.index(owner);
                           const Part& p = part[at];
                           if (p.dim < 0) {  // a run of the block's elements: its boxes
                             if (block.shape.empty()) block = base.local_box(before, group);
                             RunBoxes boxes;
                             run_boxes(block, p.lo, p.hi, boxes, -1 - p.dim);
                             for (const Box& box : boxes) {
                               const std::int64_t n = overlap_numel(piece, box);
                               if (n == 0) continue;
                               deliver.add(outermost_difference(owner, receiver), n);
                               out.send[at] += n;
                             }
                             continue;
                           }
                           const auto d = static_cast<std::size_t>(p.dim);
                           if (piece.shape.empty() || piece.shape[d] == 0) continue;
                           const std::int64_t lo = piece.offset[d] > p.lo ? piece.offset[d] : p.lo;
                           const std::int64_t end = piece.offset[d] + piece.shape[d];
                           const std::int64_t hi = end < p.hi ? end : p.hi;
                           if (hi <= lo) continue;
                           const std::int64_t n = piece.numel() / piece.shape[d] * (hi - lo);
                           deliver.add(outermost_difference(owner, receiver), n);
                           out.send[at] += n;
                         }
                       });
    deliver.price(base, cost, mine);
    second = mine.us > second ? mine.us : second;
    out.recv[i] = mine.recv;
    if (first + second > us_limit || mine.recv > recv_limit) return false;
  }
  for (int i = 0; i < ranks; ++i) out.us[i] = first + second;
  return true;
}

// Whether the group that runs collective `kind` on mesh dim k holds no element of it, from one
// member's blocks before and after the step: a gather's members share their block after, a
// reduction's their block before, and an all-to-all's group spans the block after along the
// gathered tensor dim and the block before along the others. Every member then passes a count
// of 0, which the backends start nothing for: the step sends no message and costs nothing.
constexpr bool group_holds_nothing(StepKind kind, const Placements& before, int k,
                                   const Box& mine_before, const Box& mine_after) {
  switch (kind) {
    case StepKind::all_gather: return mine_after.empty();
    case StepKind::reduce_scatter:
    case StepKind::all_reduce: return mine_before.empty();
    case StepKind::all_to_all: {
      const int gathered = before[k].dim();
      for (int d = 0; d < static_cast<int>(mine_before.shape.size()); ++d)
        if ((d == gathered ? mine_after.shape[d] : mine_before.shape[d]) == 0) return true;
      return false;
    }
    default: return false;
  }
}

// Bytes and time of one step for the rank at `coord`, whose blocks before and after the step
// are `mine_before` and `mine_after`. `padded` pads uneven pieces to the group's largest;
// otherwise the step moves exact sizes in point-to-point rounds. `base` gives the mesh, shape,
// dtype and policy; `before` and `after` the placements.
constexpr RankStepCost rank_step_cost(const Layout& base, const Placements& before,
                                      const Placements& after, StepKind kind, int k, bool padded,
                                      const MeshCoord& coord, const Box& mine_before,
                                      const Box& mine_after, const CostModel& cost) {
  RankStepCost out;
  const std::int64_t elem = base.elem_bytes();
  if (kind == StepKind::exchange) {
    const ExchangeCost e =
        exchange_reduces(before, after) ? reducing_exchange_cost(base, before, after, coord, cost)
        : makes_partial(before, after)
            ? partial_exchange_cost(base, before, after, coord, cost)
            : exchange_cost(base, before, after, coord, mine_before, mine_after, cost);
    out.bytes = {bytes_mul(e.send, elem), bytes_mul(e.recv, elem)};
    out.us = e.us;
    return out;
  }
  if (!moves_data(kind)) return out;
  const int g = base.mesh().size(k);
  if (g == 1) return out;

  // Closed forms from this rank's blocks before and after: the step is valid, so mesh dim k
  // is the innermost to cut the tensor dims it changes, and the block after (or before, for
  // a reduce-scatter) spans the whole group's range of them.
  // The group's largest piece along tensor dim d of a range of n elements.
  auto largest = [&](std::int64_t n) { return chunk_range(n, g, 0, base.policy()).size; };
  auto rest_without = [](const Box& box, int d1, int d2) {
    std::int64_t r = 1;
    for (int d = 0; d < static_cast<int>(box.shape.size()); ++d)
      if (d != d1 && d != d2) r *= box.shape[d];
    return r;
  };
  std::int64_t recv = 0, send = 0;
  double messages = g - 1;
  // Exact (unpadded uneven) steps run as point-to-point messages, none where a piece is empty:
  // the rank receives only the non-empty pieces of the others.
  int exact_messages = 0;
  // A gather's or all-to-all's: the other members' non-empty pieces of the n elements of tensor
  // dim d it gathers (none where the rank's own block after the step is empty).
  auto pieces_from_others = [&](std::int64_t n, int d) {
    if (mine_after.numel() == 0) return 0;
    return nonempty_pieces(n, g, base.policy()) - (mine_before.shape[d] > 0 ? 1 : 0);
  };
  bool uneven = false;
  switch (kind) {
    case StepKind::all_gather: {
      const int i = before[k].dim();
      const std::int64_t n = mine_after.shape[i];
      uneven = n % g != 0;
      if (padded) {
        recv = send = bytes_mul(g - 1, largest(n) * rest_without(mine_after, i, i));
      } else {
        const std::int64_t own_before = mine_before.numel();
        recv = mine_after.numel() - own_before;
        send = bytes_mul(g - 1, own_before);
        exact_messages = pieces_from_others(n, i);
      }
      break;
    }
    case StepKind::reduce_scatter: {
      const int j = after[k].dim();
      const std::int64_t n = mine_before.shape[j];
      uneven = n % g != 0;
      if (padded) {
        recv = send = bytes_mul(g - 1, largest(n) * rest_without(mine_before, j, j));
      } else {
        const std::int64_t own_after = mine_after.numel();
        recv = bytes_mul(g - 1, own_after);
        send = mine_before.numel() - own_after;
        exact_messages = own_after > 0 ? g - 1 : 0;
      }
      break;
    }
    case StepKind::all_reduce: {
      // A reduce-scatter of the block in g balanced pieces, then an all-gather of them.
      const std::int64_t own_before = mine_before.numel();
      const std::int64_t piece = chunk_range(own_before, g, coord[k], ChunkPolicy::balanced).size;
      recv = send = bytes_add(bytes_mul(g - 1, piece), own_before - piece);
      messages = 2.0 * (g - 1);
      break;
    }
    case StepKind::all_to_all: {
      const int i = before[k].dim(), j = after[k].dim();
      const std::int64_t ni = mine_after.shape[i], nj = mine_before.shape[j];
      uneven = ni % g != 0 || nj % g != 0;
      if (padded) {
        recv = send = bytes_mul(g - 1, largest(ni) * largest(nj) * rest_without(mine_before, i, j));
      } else {
        const std::int64_t kept = overlap_numel(mine_before, mine_after);
        recv = mine_after.numel() - kept;
        send = mine_before.numel() - kept;
        // From each member, its piece of dim i times this rank's piece of dim j.
        exact_messages = pieces_from_others(ni, i);
      }
      break;
    }
    default: break;
  }
  out.bytes = {bytes_mul(send, elem), bytes_mul(recv, elem)};
  out.exact_messages = exact_messages;
  // A rank that moves nothing may be in a group that holds nothing, which starts nothing.
  if (send == 0 && recv == 0 && group_holds_nothing(kind, before, k, mine_before, mine_after))
    return out;
  const bool exact = !padded && uneven;
  if (exact) messages = exact_messages;
  const double latency = exact ? cost.p2p_latency_factor : 1.0;
  out.us = cost.dims[k].time_us(messages * latency, double(out.bytes.recv));
  return out;
}

// As above, with the rank's blocks computed here.
constexpr RankStepCost rank_step_cost(const Layout& base, const Placements& before,
                                      const Placements& after, StepKind kind, int k, bool padded,
                                      const MeshCoord& coord, const CostModel& cost) {
  if (!moves_data(kind) || (kind != StepKind::exchange && base.mesh().size(k) == 1)) return {};
  return rank_step_cost(base, before, after, kind, k, padded, coord, base.local_box(before, coord),
                        base.local_box(after, coord), cost);
}

// As above, for step `s` (an exchange from a Partial cut as it says, Step::by_elements).
constexpr RankStepCost rank_step_cost(const Layout& base, const Step& s, const MeshCoord& coord,
                                      const CostModel& cost) {
  if (!s.by_elements || s.kind != StepKind::exchange || !exchange_reduces(s.before, s.after))
    return rank_step_cost(base, s.before, s.after, s.kind, s.mesh_dim, s.padded, coord, cost);
  const ExchangeCost e =
      reducing_exchange_cost(base, s.before, s.after, coord, cost, true, nullptr, true);
  RankStepCost out;
  out.bytes = {bytes_mul(e.send, base.elem_bytes()), bytes_mul(e.recv, base.elem_bytes())};
  out.us = e.us;
  return out;
}

// Whether `g` divides every rank's extent along tensor dim d under `ps`, without visiting the
// ranks: the extents are those the nested shards of d cut, and one cut of n elements into k
// pieces makes at most three sizes (full pieces, one short piece, empty ones; balanced: two).
// Returns 1 (yes), 0 (no), or -1 when the sizes are too many to follow here.
constexpr int extents_divisible(const Layout& base, const Placements& ps, int d, int g) {
  constexpr int most = 32;
  std::int64_t sizes[most] = {base.global_shape()[d]};
  int count = 1;
  for (int m = 0; m < base.mesh().ndim(); ++m) {
    if (!ps[m].is_shard(d)) continue;
    const int k = base.mesh().size(m);
    std::int64_t next[most] = {};
    int next_count = 0;
    for (int v = 0; v < count; ++v) {
      const std::int64_t n = sizes[v];
      // The first piece, the one after the last full piece, and the last: every size of the cut.
      const std::int64_t full = chunk_range(n, k, 0, base.policy()).size;
      const int after_full = full == 0 ? 0 : static_cast<int>(n / full);
      for (const int j : {0, after_full < k ? after_full : k - 1, k - 1}) {
        const std::int64_t size = chunk_range(n, k, j, base.policy()).size;
        bool seen = false;
        for (int u = 0; u < next_count && !seen; ++u) seen = next[u] == size;
        if (seen) continue;
        if (next_count == most) return -1;
        next[next_count++] = size;
      }
    }
    for (int u = 0; u < next_count; ++u) sizes[u] = next[u];
    count = next_count;
  }
  for (int v = 0; v < count; ++v)
    if (sizes[v] % g != 0) return 0;
  return 1;
}

// Whether, for every rank, the tensor dims the step gathers (i) or scatters (j) divide evenly
// among its group.
constexpr bool step_is_even(const Plan& plan, const Step& s) {
  if (s.kind != StepKind::all_gather && s.kind != StepKind::reduce_scatter &&
      s.kind != StepKind::all_to_all)
    return true;
  const Layout& base = plan.src();
  const DeviceMesh& mesh = base.mesh();
  const int k = s.mesh_dim, g = mesh.size(k);
  const int i = s.kind == StepKind::reduce_scatter ? -1 : s.before[k].dim();
  const int j = s.kind == StepKind::all_gather ? -1 : s.after[k].dim();
  const int gathered = i >= 0 ? extents_divisible(base, s.after, i, g) : 1;
  const int scattered = j >= 0 ? extents_divisible(base, s.before, j, g) : 1;
  if (gathered == 0 || scattered == 0) return false;
  if (gathered == 1 && scattered == 1) return true;
  for (int r = 0; r < mesh.size(); ++r) {  // too many sizes to follow: every rank
    const MeshCoord c = mesh.coordinate_at(r);
    if (i >= 0 && base.local_box(s.after, c).shape[i] % g != 0) return false;
    if (j >= 0 && base.local_box(s.before, c).shape[j] % g != 0) return false;
  }
  return true;
}

}  // namespace dtensor::detail
