#include <catch2/catch.hpp>

#include <dtensor/dtensor.hpp>
#include <dtensor/verify.hpp>

#include "forwarding_backend.hpp"
#include "packing_backend.hpp"
#include "random_redistribution.hpp"
#include "simulated_worlds.hpp"

#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

using namespace dtensor;

namespace {

Redistribution pair(const DeviceMesh& mesh, const char* from, const char* to, const Shape& shape,
                    DType dtype = DType::f32) {
  return {Layout(mesh, parse_placements(from), shape, dtype),
          Layout(mesh, parse_placements(to), shape, dtype)};
}

// Collectives the simulated backend counts for the tensor alone.
std::int64_t alone(const Redistribution& r) {
  const std::vector<Redistribution> one{r};
  const BatchVerification v = verify_batch_on_simulator(plan_batch<1>(one));
  REQUIRE(v.verified);
  return v.collectives;
}

using testing::PackingBackend;
// Reduce-scatters and all-reduces of 256 bytes and up by messages (MpiBackend from 1 MiB).
using MessageScatterBackend = testing::MessageReducingBackend<SimulatedBackend>;
using BatchedMessageScatterBackend = testing::BatchedMessageReducingBackend<SimulatedBackend>;

// A batch run on simulated ranks with every tensor's global view as its data, through the
// simulated backend, one without strided or batched calls (`packing`), or one that reduces by
// messages: the most scratch a rank held, and the tensors that differ from their target blocks.
struct BatchRun {
  std::int64_t most = 0;
  std::vector<std::string> wrong;
  std::int64_t planned = 0;  // workspace_bytes(batch, backend) of the backend it ran on
};
// `reducing_never`: a backend of the type that reduces by messages whose instance never does;
// `one_buffer`: the simulated backend, each tensor's source and target in one buffer.
enum class Via {
  simulated,
  packing,
  reducing_by_messages,
  reducing_batched,
  reducing_never,
  one_buffer
};
// The bytes of `rank`'s block of layout `l` cut from the global view.
std::vector<std::byte> bytes_of_block(const Layout& l, int rank) {
  return detail::visit_dtype(l.dtype(), [&]<class T>() {
    const std::vector<T> v = global_view_block<T>(l, rank);
    const auto* bytes = reinterpret_cast<const std::byte*>(v.data());
    return std::vector<std::byte>(bytes, bytes + v.size() * sizeof(T));
  });
}

template <std::size_t N>
BatchRun run_batch(const BatchPlan<N>& b, Via via) {
  BatchRun out;
  std::mutex lock;
  SimulatedWorld world(b[0].src().mesh());
  world.run([&](SimulatedBackend& simulated) {
    const int rank = simulated.rank();
    std::vector<std::vector<std::byte>> in, result;
    std::vector<TensorBuffers> buffers;
    for (const Plan& p : b) {
      in.push_back(bytes_of_block(p.src(), rank));
      if (via == Via::one_buffer)
        result.push_back(in.back());
      else
        result.emplace_back(static_cast<std::size_t>(p.dst().local_bytes(rank)));
      const void* src = via == Via::one_buffer ? result.back().data() : in.back().data();
      buffers.push_back({src, in.back().size(), result.back().data(), result.back().size()});
    }
    ExecuteStats stats;
    PackingBackend forward(simulated);
    MessageScatterBackend reducing(simulated, via == Via::reducing_never
                                                  ? std::numeric_limits<std::size_t>::max()
                                                  : MessageScatterBackend::reduce_messages_bytes);
    BatchedMessageScatterBackend batched(simulated);
    std::int64_t planned = 0;
    if (via == Via::reducing_batched) {
      execute(b, batched, std::span<const TensorBuffers>(buffers), &stats);
      planned = workspace_bytes(b, batched);
    } else if (via == Via::packing) {
      execute(b, forward, std::span<const TensorBuffers>(buffers), &stats);
      planned = workspace_bytes(b, forward);
    } else if (via == Via::reducing_by_messages || via == Via::reducing_never) {
      execute(b, reducing, std::span<const TensorBuffers>(buffers), &stats);
      planned = workspace_bytes(b, reducing);
    } else {
      execute(b, simulated, std::span<const TensorBuffers>(buffers), &stats);
      planned = workspace_bytes(b, simulated);
    }
    const std::scoped_lock guard(lock);
    out.most = std::max(out.most, stats.scratch_peak_bytes);
    out.planned = planned;
    for (std::size_t t = 0; t < b.size(); ++t)
      if (result[t] != bytes_of_block(b[t].dst(), rank))
        out.wrong.push_back(fmt::format("rank {} tensor {}", rank, t));
  });
  return out;
}

}  // namespace

TEST_CASE("a batch of one tensor is its plan", "[batch]") {
  const DeviceMesh m({2, 4});
  const std::vector<Redistribution> one{pair(m, "S(0),P", "R,S(1)", {8, 16})};
  const BatchPlan<4> b = plan_batch<4>(one);
  REQUIRE(b.size() == 1);
  CHECK(b[0] == plan_redistribute(one[0].src, one[0].dst));
  CHECK(b.collectives() == b[0].communication_steps());
  CHECK(b.bytes_recv_max() == b[0].bytes_recv_max());
  CHECK(b.est_us() == Approx(b[0].est_us()));
  CHECK(b.saving_us() == Approx(0).margin(1e-9));
}

TEST_CASE("FSDP: a layer's parameters gathered in one collective per step", "[batch]") {
  // Seed 001: every parameter of a layer sharded on dim 0 over 8 ranks, all-gathered at once.
  const DeviceMesh m({8});
  std::vector<Redistribution> params;
  const Shape shapes[] = {{1024, 256}, {256}, {256, 1024}, {1024}, {7, 5}, {3}, {64, 64}};
  const DType dtypes[] = {DType::bf16, DType::f32, DType::bf16, DType::f32,
                          DType::f16,  DType::i64, DType::bf16};
  for (std::size_t i = 0; i < std::size(shapes); ++i)
    params.push_back(pair(m, "S(0)", "R", shapes[i], dtypes[i]));
  const BatchPlan<16> b = plan_batch<16>(params);
  // The even ones share one all-gather; the uneven ones ({7, 5}, {3}) one point-to-point round.
  CHECK(b.collectives() == 2);
  CHECK(b.collectives_unbatched() == 7);
  CHECK(b.saving_us() > 0);
  CHECK(b.est_us() < b.est_us_unbatched());
  const BatchVerification v = testing::verified_batch(b);
  INFO(v.difference);
  CHECK(v.verified);
  CHECK(v.collectives == 2);
  // The scratch a run holds stays within workspace_bytes.
  std::int64_t most = 0;
  std::mutex lock;
  SimulatedWorld world(m);
  world.run([&](SimulatedBackend& backend) {
    std::vector<std::vector<std::byte>> in, out;
    std::vector<TensorBuffers> buffers;
    for (const Plan& p : b) {
      in.emplace_back(static_cast<std::size_t>(p.src().local_bytes(backend.rank())));
      out.emplace_back(static_cast<std::size_t>(p.dst().local_bytes(backend.rank())));
      buffers.push_back({in.back().data(), in.back().size(), out.back().data(), out.back().size()});
    }
    ExecuteStats stats;
    execute(b, backend, std::span<const TensorBuffers>(buffers), &stats);
    const std::scoped_lock guard(lock);
    most = std::max(most, stats.scratch_peak_bytes);
  });
  CHECK(most > 0);
  CHECK(most <= workspace_bytes(b));
  std::int64_t unbatched = 0;
  for (const Redistribution& r : params) unbatched += alone(r);
  CHECK(unbatched == 7);

  // Padded (and without exchanges), the uneven ones join the all-gather.
  const BatchPlan<16> padded =
      plan_batch<16>(params, {.padding = Padding::always, .allow_exchange = false});
  CHECK(padded.collectives() == 1);
  const BatchVerification vp = testing::verified_batch(padded);
  INFO(vp.difference);
  CHECK(vp.verified);
  CHECK(vp.collectives == 1);
}

namespace {
// Whether execute_async takes a batch of this kind: an lvalue, not a temporary (which would be
// gone before the execution finishes).
template <class Batch>
concept AsyncTakes = requires(Batch&& batch, SimulatedBackend& b,
                              std::span<const TensorBuffers> buffers) {
  execute_async(std::forward<Batch>(batch), b, buffers);
};
static_assert(AsyncTakes<const BatchPlan<4>&> && !AsyncTakes<BatchPlan<4>>);
}  // namespace

TEST_CASE("execute_async runs a batch: at once where the backend is not asynchronous", "[batch]") {
  // On the simulator (no start_* operations) the batch has run when execute_async returns, with
  // the results and scratch of execute(); MPI's asynchronous batches: tests/mpi/mpi_batch_test.
  const DeviceMesh m({4});
  std::vector<Redistribution> layer{pair(m, "S(0)", "R", {64, 8}), pair(m, "S(1)", "R", {4, 32}),
                                    pair(m, "S(0)", "R", {7, 3}, DType::bf16)};
  const BatchPlan<4> b = plan_batch<4>(layer);
  std::mutex lock;
  std::vector<std::string> wrong;
  SimulatedWorld world(m);
  world.run([&](SimulatedBackend& backend) {
    const int rank = backend.rank();
    std::vector<std::vector<std::byte>> in, out[2];
    std::vector<TensorBuffers> buffers[2];
    for (const Plan& p : b) in.push_back(bytes_of_block(p.src(), rank));
    for (int run = 0; run < 2; ++run)
      for (std::size_t t = 0; t < b.size(); ++t) {
        out[run].emplace_back(static_cast<std::size_t>(b[t].dst().local_bytes(rank)));
        buffers[run].push_back(
            {in[t].data(), in[t].size(), out[run][t].data(), out[run][t].size()});
      }
    ExecuteStats stats;
    execute(b, backend, std::span<const TensorBuffers>(buffers[0]), &stats);
    Execution<SimulatedBackend> e =
        execute_async(b, backend, std::span<const TensorBuffers>(buffers[1]));
    const bool done = e.test();
    e.wait();
    const std::scoped_lock guard(lock);
    if (!done) wrong.push_back(fmt::format("rank {}: not done at once", rank));
    if (e.scratch_peak_bytes() != stats.scratch_peak_bytes)
      wrong.push_back(fmt::format("rank {}: scratch {} against {}", rank, e.scratch_peak_bytes(),
                                  stats.scratch_peak_bytes));
    for (std::size_t t = 0; t < b.size(); ++t) {
      const std::vector<std::byte> want = bytes_of_block(b[t].dst(), rank);
      if (out[0][t] != want || out[1][t] != want)
        wrong.push_back(fmt::format("rank {} tensor {}", rank, t));
    }
  });
  INFO(fmt::format("{}", fmt::join(wrong, "; ")));
  CHECK(wrong.empty());
}

TEST_CASE("gradients reduced together: one all-reduce per dtype, or one message round", "[batch]") {
  // One all-reduce per dtype (a collective cannot mix dtypes).
  const DeviceMesh m8({8});
  std::vector<Redistribution> large;
  for (int i = 0; i < 6; ++i)
    large.push_back(
        pair(m8, "P", "R", {2048 * (i + 1), 64}, i % 2 == 0 ? DType::f32 : DType::bf16));
  const BatchPlan<8> b = plan_batch<8>(large);
  CHECK(b.collectives() == 2);  // reductions fuse per dtype
  for (const BatchRound& r : b.rounds()) {
    CHECK(r.kind == StepKind::all_reduce);
    CHECK(r.tensors == 3);
  }
  const BatchVerification v = testing::verified_batch(b);
  INFO(v.difference);
  CHECK(v.verified);
  CHECK(v.collectives == 2);

  // Scheduled for the fewest calls, on 2x2 (groups of 2, where messages move what the ring
  // moves): one point-to-point round, where the all-reduces call the backend 2 x 2 times.
  const DeviceMesh m({2, 2});
  std::vector<Redistribution> grads;
  for (int i = 0; i < 6; ++i)
    grads.push_back(pair(m, "P,R", "R,R", {4 + 4 * i, 8}, i % 2 == 0 ? DType::f32 : DType::bf16));
  const BatchPlan<8> fused = plan_batch<8>(grads);
  CHECK(fused.collectives() == 2);
  CHECK(fused.backend_calls() == 2 * 2);
  CHECK(fused.backend_calls_alone_max() == 2);
  const BatchPlan<8> small = plan_batch<8>(grads, {}, BatchSchedule::fewest_calls);
  REQUIRE(small.collectives() == 1);
  CHECK(small.rounds()[0].kind == StepKind::exchange);
  CHECK(small.rounds()[0].tensors == 6);
  CHECK(small.point_to_point(0, 0));
  CHECK(small.est_us() < small.est_us_unbatched());
  const BatchVerification vs = testing::verified_batch(small);
  INFO(vs.difference);
  CHECK(vs.verified);
  CHECK(vs.collectives == 1);
  CHECK(vs.collectives < alone(grads[0]));
}

TEST_CASE("aligned plans: no more collectives than the longest one", "[batch]") {
  // Tensors whose collectives are a subsequence of the longest plan's.
  const DeviceMesh m({2, 4});
  const std::vector<Redistribution> batch{
      pair(m, "S(0),S(1)", "R,R", {8, 16}),            // all-gathers on mesh dims 1 and 0
      pair(m, "S(0),R", "R,R", {16, 4}, DType::bf16),  // all-gather on mesh dim 0
      pair(m, "R,S(1)", "R,R", {4, 8}, DType::i64),    // all-gather on mesh dim 1
      pair(m, "S(1),S(0)", "R,R", {32, 8}),            // all-gathers on mesh dims 1 and 0
      pair(m, "R,R", "R,R", {3, 3}),                   // nothing
  };
  const BatchPlan<8> b = plan_batch<8>(batch);
  int longest = 0;
  for (const Plan& p : b) longest = std::max(longest, p.communication_steps());
  CHECK(b.collectives() == longest);
  const BatchVerification v = testing::verified_batch(b);
  INFO(v.difference);
  CHECK(v.verified);
  std::int64_t most = 0;
  for (const Redistribution& r : batch) most = std::max(most, alone(r));
  CHECK(v.collectives <= most);
}

TEST_CASE("exchanges into a Partial share one point-to-point round with other exchanges",
          "[batch]") {
  // Under the bytes objective each of these is one exchange (the first two into a Partial, each
  // group's ranks splitting what none of them holds): one round moves all four.
  const DeviceMesh m({2, 4});
  const std::vector<Redistribution> batch{
      pair(m, "R,S(0)", "P(sum),S(1)", {16, 8}),
      pair(m, "S(0),S(1)", "P(max),S(0)", {5, 7}, DType::i64),
      pair(m, "S(0),R", "R,S(0)", {16, 8}, DType::bf16),
      pair(m, "S(1),S(0)", "P(min),S(1)", {8, 12}, DType::i32),
  };
  const BatchPlan<8> b = plan_batch<8>(batch, {.objective = Objective::bytes});
  for (const Plan& p : b) {
    REQUIRE(p.size() == 1);
    CHECK(p[0].kind == StepKind::exchange);
    CHECK(p.bytes_recv_max() == p.lower_bound_bytes_recv_max());
  }
  CHECK(detail::makes_partial(b[0][0].before, b[0][0].after));
  CHECK(b.collectives() == 1);
  const BatchVerification v = testing::verified_batch(b);
  INFO(v.difference);
  CHECK(v.verified);
  CHECK(v.collectives == 1);
}

TEST_CASE("random batches of 1 to 16 mixed tensors: the global view on every rank",
          "[batch][oracle]") {
  std::mt19937 rng(20261123);
  const DeviceMesh meshes[] = {DeviceMesh({4}), DeviceMesh({2, 2}), DeviceMesh({2, 4}),
                               DeviceMesh({2, 2, 2})};
  int cases = 0;
  std::int64_t batched = 0, one_by_one = 0, fewest = 0, busiest = 0;
  for (const DeviceMesh& mesh : meshes)
    for (int size : {1, 2, 5, 16}) {
      for (int repeat = 0; repeat < 3; ++repeat) {
        std::vector<Redistribution> batch;
        for (int t = 0; t < size; ++t) batch.push_back(testing::random_redistribution(rng, mesh));
        const BatchPlan<16> b = plan_batch<16>(batch);
        const BatchVerification v = testing::verified_batch(b);
        INFO(fmt::format("mesh {} batch of {}: {}", mesh.shape(), size, v.difference));
        REQUIRE(v.verified);
        std::int64_t singles = 0;
        for (const Redistribution& r : batch) singles += alone(r);
        CHECK(v.collectives <= singles);
        CHECK(v.collectives == b.backend_calls());
        CHECK(b.collectives() <= b.collectives_unbatched());
        CHECK(b.est_us() <= b.est_us_unbatched() + 1e-9);
        // Scheduled for the fewest calls: no more than the busiest tensor alone.
        std::int64_t most = 0;
        for (const Redistribution& r : batch) most = std::max(most, alone(r));
        const BatchPlan<16> f = plan_batch<16>(batch, {}, BatchSchedule::fewest_calls);
        const BatchVerification vf = testing::verified_batch(f);
        INFO(vf.difference);
        REQUIRE(vf.verified);
        CHECK(vf.collectives <= most);
        CHECK(vf.collectives == f.backend_calls());
        CHECK(f.backend_calls_alone_max() == most);
        fewest += vf.collectives;
        busiest += most;
        batched += v.collectives;
        one_by_one += singles;
        ++cases;
      }
    }
  WARN(
      fmt::format("random batches: {} cases, {} backend calls batched (fused rounds) against {} "
                  "one by one; {} scheduled for the fewest calls, against {} for the busiest "
                  "tensor of each batch alone",
                  cases, batched, one_by_one, fewest, busiest));
}

TEST_CASE("strided pieces packed by the round, on backends with and without strided calls",
          "[batch][strided]") {
  // Column pieces (S(0) -> S(1), S(1) -> S(0), S(1) -> R): the round packs them from where they
  // lie, with other tensors or alone; alone on a backend without strided calls too.
  static_assert(!StridedAllToAll<PackingBackend> && !StridedAllGather<PackingBackend>);
  const DeviceMesh mesh({4});
  const auto layout = [&](std::string_view p, Shape shape, DType dtype) {
    return Layout(mesh, parse_placements(p), std::move(shape), dtype);
  };
  const std::vector<std::vector<Redistribution>> batches = {
      {{layout("S(0)", {8, 12}, DType::f32), layout("S(1)", {8, 12}, DType::f32)}},
      {{layout("S(1)", {8, 12}, DType::bf16), layout("R", {8, 12}, DType::bf16)}},
      {{layout("S(0)", {8, 12}, DType::f32), layout("S(1)", {8, 12}, DType::f32)},
       {layout("S(0)", {4, 20}, DType::i64), layout("S(1)", {4, 20}, DType::i64)},
       {layout("S(1)", {16, 4}, DType::f32), layout("S(0)", {16, 4}, DType::f32)}},
      {{layout("S(1)", {8, 12}, DType::f32), layout("R", {8, 12}, DType::f32)},
       {layout("S(0)", {8, 8}, DType::f32), layout("R", {8, 8}, DType::f32)},
       {layout("S(2)", {2, 3, 8}, DType::f32), layout("R", {2, 3, 8}, DType::f32)}}};
  for (const auto& tensors : batches)
    for (const bool packing : {false, true}) {
      const BatchPlan<16> b = plan_batch<16>(tensors);
      INFO(fmt::format("{} tensors, packing backend: {}", tensors.size(), packing));
      const auto [most, wrong, planned] = run_batch(b, packing ? Via::packing : Via::simulated);
      CHECK(wrong.empty());
      CHECK(most <= planned);
      CHECK(planned ==
            (packing ? workspace_bytes<PackingBackend>(b) : workspace_bytes<SimulatedBackend>(b)));
      CHECK(workspace_bytes<SimulatedBackend>(b) <= workspace_bytes(b));
      CHECK(workspace_bytes<PackingBackend>(b) == workspace_bytes(b));
    }
}

namespace {

// A batch of one round of `kind` on mesh dim 1 of 2x4, whose steps hold no scratch of their
// own: on the simulated backend (which runs the round from the tensors' buffers) it holds no
// scratch at all, and on a packing backend what workspace_bytes(batch) plans; the global view
// on every rank both ways.
void check_round_from_buffers(const BatchPlan<8>& b, StepKind kind) {
  REQUIRE(b.collectives() == 1);
  REQUIRE(b.rounds()[0].kind == kind);
  CHECK(workspace_bytes<SimulatedBackend>(b) == 0);
  CHECK(workspace_bytes(b) > 0);
  const BatchVerification v = testing::verified_batch(b);
  INFO(v.difference);
  CHECK(v.verified);
  CHECK(v.collectives == 2);  // one per group of mesh dim 1
  for (const bool packing : {false, true}) {
    const auto [most, wrong, planned] = run_batch(b, packing ? Via::packing : Via::simulated);
    CHECK(wrong.empty());
    INFO("packing backend: " << packing);
    CHECK(most == (packing ? workspace_bytes(b) : 0));
    CHECK(planned == most);
  }
}

}  // namespace

TEST_CASE("an all-to-all round moves every tensor from its own buffers, on a backend that can",
          "[batch][strided]") {
  // Sequence parallelism's all-to-alls (seed 002) for several tensors at once: row pieces and
  // column pieces, four dtypes. A BatchedAllToAll backend runs the round from the tensors'
  // buffers as they lie; a backend without it packs both sides.
  static_assert(BatchedAllToAll<SimulatedBackend>);
  static_assert(!BatchedAllToAll<PackingBackend>);
  const DeviceMesh mesh({2, 4});
  const std::vector<Redistribution> tensors = {
      pair(mesh, "R,S(0)", "R,S(1)", {16, 8}), pair(mesh, "R,S(1)", "R,S(0)", {8, 16}, DType::bf16),
      pair(mesh, "S(1),S(0)", "S(1),S(2)", {4, 6, 8}, DType::i64),
      pair(mesh, "R,S(0)", "R,S(1)", {32, 4}, DType::f16)};
  check_round_from_buffers(plan_batch<8>(tensors), StepKind::all_to_all);
}

TEST_CASE("under Memory::bounded an all-to-all round runs by peers on a backend that packs",
          "[batch][memory]") {
  // Without BatchedAllToAll (NCCL) a packed all-to-all round holds the packed block on both
  // sides, twice the packed larger side; under Memory::bounded it runs as g - 1 point-to-point
  // rounds, each packing one member's pieces and unpacking another's: a member's share each side.
  const DeviceMesh mesh({2, 4});
  const std::vector<Redistribution> tensors = {
      pair(mesh, "R,S(0)", "R,S(1)", {16, 8}), pair(mesh, "R,S(1)", "R,S(0)", {8, 16}, DType::bf16),
      pair(mesh, "S(1),S(0)", "S(1),S(2)", {4, 6, 8}, DType::i64),
      pair(mesh, "R,S(0)", "R,S(1)", {32, 4}, DType::f16)};
  const BatchPlan<8> fast = plan_batch<8>(tensors);
  const BatchPlan<8> bounded = plan_batch<8>(tensors, PlanOptions{.memory = Memory::bounded});
  REQUIRE(bounded.collectives() == 1);
  REQUIRE(bounded.rounds()[0].kind == StepKind::all_to_all);
  std::int64_t larger = std::numeric_limits<std::int64_t>::max();
  for (int rank = 0; rank < mesh.size(); ++rank) {
    std::int64_t src = 0, dst = 0;
    for (const Plan& p : bounded) {
      src += p.src().local_bytes(rank);
      dst += p.dst().local_bytes(rank);
    }
    larger = std::min(larger, std::max(src, dst));
  }
  CHECK(workspace_bytes<PackingBackend>(fast) == 2 * larger);
  CHECK(workspace_bytes<PackingBackend>(bounded) == 2 * larger / 4);
  const auto [most, wrong, planned] = run_batch(bounded, Via::packing);
  CHECK(wrong.empty());
  CHECK(most == planned);
  CHECK(planned == workspace_bytes<PackingBackend>(bounded));
  // A backend that runs the round from the tensors' buffers still does so, holding nothing.
  CHECK(workspace_bytes<SimulatedBackend>(bounded) == 0);
}

TEST_CASE("an all-gather round gathers every tensor into its own buffers, on a backend that can",
          "[batch][strided]") {
  // FSDP's all-gather of a layer's parameters (seed 001), row and column pieces, four dtypes. A
  // BatchedAllGather backend gathers every tensor's pieces where they go, with nothing packed or
  // unpacked; a backend without it packs this member's pieces into one block where its part of
  // the gathered block goes, and unpacks the gathered block.
  static_assert(BatchedAllGather<SimulatedBackend>);
  static_assert(!BatchedAllGather<PackingBackend>);
  const DeviceMesh mesh({2, 4});
  const std::vector<Redistribution> tensors = {
      pair(mesh, "R,S(0)", "R,R", {16, 8}), pair(mesh, "R,S(1)", "R,R", {8, 16}, DType::bf16),
      pair(mesh, "S(1),S(2)", "S(1),R", {4, 6, 8}, DType::i64),
      pair(mesh, "R,S(0)", "R,R", {32, 4}, DType::f16)};
  check_round_from_buffers(plan_batch<8>(tensors), StepKind::all_gather);
}

TEST_CASE("batches refuse what they cannot run", "[batch][errors]") {
  const std::vector<Redistribution> mixed{pair(DeviceMesh({4}), "S(0)", "R", {8}),
                                          pair(DeviceMesh({2, 2}), "S(0),R", "R,R", {8})};
  CHECK_THROWS_WITH(plan_batch<4>(mixed), Catch::Contains("tensor 1 is on 2x2"));
  const std::vector<Redistribution> three(3, pair(DeviceMesh({4}), "S(0)", "R", {8}));
  CHECK_THROWS_WITH(plan_batch<2>(three), Catch::Contains("at most 2 tensors, got 3"));
  const BatchPlan<4> b = plan_batch<4>(three);
  SimulatedWorld world(DeviceMesh({4}));
  CHECK_THROWS_WITH(world.run([&](SimulatedBackend& backend) {
    std::vector<float> src(2), dst(8);
    const std::vector<TensorBuffers> two(2, {src.data(), 8, dst.data(), 32});
    execute(b, backend, std::span<const TensorBuffers>(two));
  }),
                    Catch::Contains("3 tensors but 2 buffers"));
  // A target over another tensor's target or source is refused before anything moves; the
  // tensors may share their source.
  auto run_on = [&](auto buffers_of) {
    world.run([&](SimulatedBackend& backend) {
      std::vector<float> src(2, 1.0f), dst(8), other(8), third(8);
      const std::vector<TensorBuffers> buffers = buffers_of(src, dst, other, third);
      execute(b, backend, std::span<const TensorBuffers>(buffers));
      CHECK(std::all_of(third.begin(), third.end(), [](float v) { return v == 1.0f; }));
    });
  };
  using V = std::vector<float>;
  CHECK_THROWS_WITH(run_on([](V& s, V& d, V& o, V&) {
                      return std::vector<TensorBuffers>{{s.data(), 8, d.data(), 32},
                                                        {s.data(), 8, o.data(), 32},
                                                        {s.data(), 8, d.data(), 32}};
                    }),
                    Catch::Contains("the target buffer of tensor 0 overlaps the target buffer of "
                                    "tensor 2 on rank"));
  CHECK_THROWS_WITH(run_on([](V& s, V& d, V& o, V&) {
                      return std::vector<TensorBuffers>{{s.data(), 8, d.data(), 32},
                                                        {d.data() + 2, 8, o.data(), 32},
                                                        {s.data(), 8, o.data(), 32}};
                    }),
                    Catch::Contains("the target buffer of tensor 0 overlaps the source buffer of "
                                    "tensor 1 on rank"));
  run_on([](V& s, V& d, V& o, V& t) {
    return std::vector<TensorBuffers>{
        {s.data(), 8, d.data(), 32}, {s.data(), 8, o.data(), 32}, {s.data(), 8, t.data(), 32}};
  });
  // Members whose parts of a batched all-to-all do not match: an error on every rank.
  CHECK_THROWS_WITH(world.run([&](SimulatedBackend& backend) {
    std::vector<std::byte> send(32), recv(32);
    const std::size_t run = backend.rank() == 2 ? 4 : 8;
    const std::vector<AllToAllPart> parts{
        {send.data(), recv.data(), {1, run, 4 * run}, {1, run, 4 * run}},
        {send.data(), recv.data(), {1, 8 - run, 32 - 4 * run}, {1, 8 - run, 32 - 4 * run}}};
    backend.all_to_all_batched(0, parts);
  }),
                    Catch::Contains("bytes of part 0"));
  // Members whose parts of a batched all-gather do not match: an error on every rank.
  CHECK_THROWS_WITH(world.run([&](SimulatedBackend& backend) {
    std::vector<std::byte> send(8), recv(32);
    const std::size_t run = backend.rank() == 2 ? 4 : 8;
    const std::vector<AllGatherPart> parts{{send.data(), recv.data(), {1, run, 4 * run}},
                                           {send.data(), recv.data(), {1, 8 - run, 32 - 4 * run}}};
    backend.all_gather_batched(0, parts);
  }),
                    Catch::Contains("simulated batched all-gather: rank 0 gathers 8 bytes per "
                                    "member of part 0, rank 2 4"));
  // Empty parts may have null buffers (an empty block's): batched calls skip them, never
  // offsetting a null pointer (UBSan in the asan preset), and move the other parts.
  SimulatedWorld four(DeviceMesh({4}));
  four.run([&](SimulatedBackend& backend) {
    const auto me = static_cast<std::size_t>(backend.rank());
    std::vector<std::uint8_t> send(4, static_cast<std::uint8_t>(me)), recv(16, 0xff);
    const std::vector<AllGatherPart> gathered{{nullptr, nullptr, {1, 0, 0}},
                                              {send.data(), recv.data(), {1, 4, 16}}};
    backend.all_gather_batched(0, gathered);
    for (std::size_t i = 0; i < recv.size(); ++i) CHECK(recv[i] == i / 4);
    std::vector<std::uint8_t> swapped(16, 0xff);
    std::vector<std::uint8_t> pieces(16);
    for (std::size_t i = 0; i < pieces.size(); ++i)
      pieces[i] = static_cast<std::uint8_t>(me * 4 + i / 4);
    const std::vector<AllToAllPart> exchanged{
        {nullptr, nullptr, {1, 0, 0}, {1, 0, 0}},
        {pieces.data(), swapped.data(), {1, 4, 16}, {1, 4, 16}}};
    backend.all_to_all_batched(0, exchanged);
    for (std::size_t i = 0; i < swapped.size(); ++i) CHECK(swapped[i] == (i / 4) * 4 + me);
  });
}

TEST_CASE("the batch's overlap check misses no target that meets another tensor's buffer",
          "[batch][errors]") {
  // Random buffers in one arena against every pair compared: where some target meets another
  // tensor's source or target, the sorted check must say they may meet (then every pair is
  // compared to name the first); where none does, it mostly says so (its fast path).
  std::mt19937 rng(7);
  std::vector<std::byte> arena(512);
  int fast = 0, false_alarms = 0;
  for (int round = 0; round < 4000; ++round) {
    const auto n = std::uniform_int_distribution<std::size_t>(1, 12)(rng);
    const auto spread = std::uniform_int_distribution<std::size_t>(16, 400)(rng);
    std::uniform_int_distribution<std::size_t> at(0, spread), len(0, 24);
    std::vector<TensorBuffers> buffers;
    std::vector<std::size_t> src_bytes, dst_bytes;
    for (std::size_t t = 0; t < n; ++t) {
      const std::size_t s = at(rng), d = at(rng);
      // Now and then a tensor's target over its own source (in place), or a shared source.
      const bool in_place = rng() % 8 == 0;
      const std::size_t s_at =
          !buffers.empty() && rng() % 6 == 0
              ? static_cast<std::size_t>(static_cast<const std::byte*>(buffers.back().src) -
                                         arena.data())
              : s;
      src_bytes.push_back(len(rng));
      dst_bytes.push_back(len(rng));
      buffers.push_back({arena.data() + s_at, src_bytes.back(),
                         arena.data() + (in_place ? s_at : d), dst_bytes.back()});
    }
    bool meet = false;
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t u = 0; u < n; ++u)
        if (u != t)
          meet =
              meet ||
              detail::common_bytes(buffers[t].dst, dst_bytes[t], buffers[u].src, src_bytes[u]) !=
                  0 ||
              detail::common_bytes(buffers[t].dst, dst_bytes[t], buffers[u].dst, dst_bytes[u]) != 0;
    std::vector<detail::BlockBytes> blocks;
    for (std::size_t t = 0; t < n; ++t) blocks.push_back({src_bytes[t], dst_bytes[t]});
    const bool may = detail::batch_buffers_may_meet(buffers, blocks);
    INFO("round " << round << ", " << n << " tensors");
    if (meet) REQUIRE(may);
    fast += may ? 0 : 1;
    // (It may say so where none does: a target over its own source inside sources shared with
    // others; then comparing every pair finds nothing.)
    if (!meet) false_alarms += may ? 1 : 0;
  }
  CHECK(fast > 100);
  CHECK(false_alarms * 10 < fast);
}

TEST_CASE("a batch's large reduction rounds run as point-to-point rounds", "[batch]") {
  // Gradients reduce-scattered or all-reduced together (f32 and bf16 rounds, even and uneven,
  // 1-D and 2-D meshes): every tensor equals its target block on every rank, no reduction call
  // is left, and the scratch stays within workspace_bytes<MessageScatterBackend>(batch).
  struct Case {
    const char* mesh;
    std::vector<std::pair<const char*, const char*>> pairs;
  };
  const Case cases[] = {{"8", {{"P", "S(0)"}}},
                        {"2x4", {{"P,S(0)", "S(0),S(0)"}, {"R,P", "R,S(1)"}}},
                        {"2x2", {{"P,P", "S(0),S(1)"}}},
                        {"2x4", {{"P,R", "R,R"}, {"R,P", "R,R"}}},
                        {"8", {{"P", "R"}}}};
  for (const Case& c : cases) {
    const DeviceMesh mesh = parse_mesh(c.mesh);
    std::vector<Redistribution> tensors;
    for (int t = 0; t < 12; ++t) {
      const auto& [from, to] = c.pairs[static_cast<std::size_t>(t) % c.pairs.size()];
      const Shape shape{8 * (1 + t % 4) + (t % 3 == 2 ? 3 : 0), 16};
      tensors.push_back(pair(mesh, from, to, shape, t % 2 ? DType::bf16 : DType::f32));
    }
    const BatchPlan<16> b = plan_batch<16>(tensors);
    INFO(c.mesh);
    CHECK(std::any_of(b.rounds().begin(), b.rounds().end(), [](const BatchRound& r) {
      return (r.kind == StepKind::reduce_scatter || r.kind == StepKind::all_reduce) &&
             r.tensors > 1;
    }));
    MessageScatterBackend::calls = 0;
    const auto [most, wrong, planned] = run_batch(b, Via::reducing_by_messages);
    CHECK(wrong == std::vector<std::string>{});
    CHECK(MessageScatterBackend::calls == 0);
    CHECK(most <= workspace_bytes<MessageScatterBackend>(b));
    CHECK(planned == workspace_bytes<MessageScatterBackend>(b));
    // On a backend that also runs batched all-to-alls and all-gathers (as MPI does), the
    // reduction rounds send from the tensors' buffers and reduce into their targets: the same
    // values, and only the partials staged.
    static_assert(BatchedAllToAll<BatchedMessageScatterBackend> &&
                  BatchedAllGather<BatchedMessageScatterBackend>);
    const BatchRun batched = run_batch(b, Via::reducing_batched);
    CHECK(batched.wrong == std::vector<std::string>{});
    CHECK(MessageScatterBackend::calls == 0);
    CHECK(batched.most <= batched.planned);
    CHECK(batched.planned == workspace_bytes<BatchedMessageScatterBackend>(b));
    CHECK(batched.planned <= planned);
    // The same type, an instance that never reduces by messages: the collectives, and the
    // scratch that instance's workspace_bytes counts.
    const BatchRun never = run_batch(b, Via::reducing_never);
    CHECK(never.wrong == std::vector<std::string>{});
    CHECK(MessageScatterBackend::calls > 0);
    CHECK(never.most <= never.planned);
    CHECK(never.planned == workspace_bytes(b));
  }
}

TEST_CASE("a batch's all-reduce round by messages packs where a block does not cut in g slices",
          "[batch]") {
  // From the tensors' buffers each block is cut into g equal slices; a round with a block of
  // 21 elements over the 2 members of mesh dim 0 packs, as on a backend without batched calls.
  // Both give the same values as the global view, with the scratch planned.
  const DeviceMesh m({2, 4});
  for (const std::int64_t cols : {3, 8}) {
    std::vector<Redistribution> tensors;
    for (int t = 0; t < 4; ++t)
      tensors.push_back(pair(m, "P,R", "R,R", {7 + 8 * t, cols}, t % 2 ? DType::bf16 : DType::f32));
    const BatchPlan<8> b = plan_batch<8>(tensors);
    REQUIRE(b.rounds()[0].kind == StepKind::all_reduce);
    INFO(cols << " columns");
    const BatchRun batched = run_batch(b, Via::reducing_batched);
    const BatchRun packed = run_batch(b, Via::reducing_by_messages);
    CHECK(batched.wrong == std::vector<std::string>{});
    CHECK(packed.wrong == std::vector<std::string>{});
    CHECK(batched.most <= batched.planned);
    CHECK(batched.planned == workspace_bytes<BatchedMessageScatterBackend>(b));
    CHECK(packed.planned == workspace_bytes<MessageScatterBackend>(b));
    // 8 columns: every block cuts evenly, and the partials take less than the packed round.
    CHECK((cols == 8 ? batched.planned < packed.planned : batched.planned == packed.planned));
  }
}

TEST_CASE("a batch of all-reduces runs in place, each tensor in one buffer", "[batch]") {
  // Gradients all-reduced together where they lie (f32 and bf16, even and uneven, on 4 and 2x2).
  for (const char* mesh : {"4", "2x2"}) {
    const DeviceMesh m = parse_mesh(mesh);
    const char* from = m.ndim() == 1 ? "P" : "R,P";
    const char* to = m.ndim() == 1 ? "R" : "R,R";
    std::vector<Redistribution> tensors;
    for (int t = 0; t < 5; ++t)
      tensors.push_back(pair(m, from, to, {8 + 3 * t, 4}, t % 2 ? DType::bf16 : DType::f32));
    const BatchPlan<8> b = plan_batch<8>(tensors);
    for (const Plan& p : b) REQUIRE(runs_in_place(p));
    INFO(mesh);
    const BatchRun run = run_batch(b, Via::one_buffer);
    CHECK(run.wrong == std::vector<std::string>{});
  }
}

TEST_CASE("a batch of all-gathers runs in place, each source at its rank's slab", "[batch]") {
  // FSDP's layer: every parameter's shard inside its gathered buffer (MPI_IN_PLACE's layout),
  // gathered in one round: from the tensors' buffers (BatchedAllGather) and packed.
  const DeviceMesh m({4});
  std::vector<Redistribution> tensors;
  for (int t = 0; t < 4; ++t)
    tensors.push_back(pair(m, "S(0)", "R", {8 * (1 + t), 3}, t % 2 ? DType::bf16 : DType::f32));
  const BatchPlan<8> b = plan_batch<8>(tensors);
  CHECK(b.collectives() == 1);
  std::mutex lock;
  std::vector<std::string> wrong;
  SimulatedWorld(m).run([&](SimulatedBackend& simulated) {
    PackingBackend packing(simulated);
    for (const bool packed : {false, true}) {
      const int rank = simulated.rank();
      std::vector<std::vector<std::byte>> whole;
      std::vector<TensorBuffers> buffers;
      for (const Plan& p : b) {
        const auto piece = static_cast<std::size_t>(p.src().local_bytes(rank));
        whole.emplace_back(static_cast<std::size_t>(p.dst().local_bytes(rank)));
        std::byte* slot = whole.back().data() + static_cast<std::size_t>(rank) * piece;
        detail::visit_dtype(p.src().dtype(), [&]<class T>() {
          const std::vector<T> mine = global_view_block<T>(p.src(), rank);
          std::memcpy(slot, mine.data(), piece);
        });
        buffers.push_back({slot, piece, whole.back().data(), whole.back().size()});
      }
      if (packed)
        execute(b, packing, std::span<const TensorBuffers>(buffers));
      else
        execute(b, simulated, std::span<const TensorBuffers>(buffers));
      for (std::size_t t = 0; t < b.size(); ++t)
        detail::visit_dtype(b[t].dst().dtype(), [&]<class T>() {
          const std::vector<T> want = global_view_block<T>(b[t].dst(), rank);
          if (std::memcmp(want.data(), whole[t].data(), whole[t].size()) != 0) {
            const std::scoped_lock guard(lock);
            wrong.push_back(fmt::format("rank {} tensor {} (packed: {})", rank, t, packed));
          }
        });
    }
  });
  CHECK(wrong == std::vector<std::string>{});
}

TEST_CASE("a batch's one-tensor reduction round reduces by messages too", "[batch]") {
  // A gradient alone in its rounds (beside a gather of another kind): it runs as it would
  // alone through execute(), by messages, not as the backend's collective.
  const DeviceMesh m({4});
  const std::vector<Redistribution> tensors{pair(m, "P", "S(0)", {16, 8}),
                                            pair(m, "S(0)", "R", {8, 8}, DType::bf16),
                                            pair(m, "P", "R", {8, 4}, DType::i64)};
  const BatchPlan<4> b = plan_batch<4>(tensors);
  REQUIRE(std::all_of(b.rounds().begin(), b.rounds().end(),
                      [](const BatchRound& r) { return r.tensors == 1; }));
  MessageScatterBackend::calls = 0;
  const auto [most, wrong, planned] = run_batch(b, Via::reducing_by_messages);
  CHECK(wrong == std::vector<std::string>{});
  CHECK(MessageScatterBackend::calls == 0);
  CHECK(most <= planned);
  CHECK(planned == workspace_bytes<MessageScatterBackend>(b));
}
