#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../backend.hpp"
#include "../device_mesh.hpp"
#include "../errors.hpp"
#include "../layout.hpp"
#include "../local_ops.hpp"
#include "../plan.hpp"

// Every rank of a mesh inside one process, each on its own thread. Collectives meet at a
// rendezvous of their group; reductions combine in group-index order, so results are
// deterministic and replicas bit-identical. Counts the bytes each rank sends and receives, by
// the same ring-algorithm convention the planner uses. The reference backend for tests.
//
// The memory the ranks' buffers live in is a "lane" per rank: its LocalOps, and fences that
// order one rank's work after another's. SimulatedWorld uses host memory (no fences needed);
// backend/simulated_device.cuh puts every rank on one GPU, each with its own stream.
namespace dtensor {

namespace detail {

// A simulated rank on host memory: work is done when the call returns, so fences are empty.
struct HostLane {
  static constexpr MemorySpace memory = MemorySpace::host;
  // What every lane of a world is made with (on a device lane: the device).
  struct Setting {};
  HostLane(int /*rank index*/, const Setting& /*setting*/) {}
  // Called on the rank's thread before it runs.
  void attach() noexcept {}
  [[nodiscard]] HostOps ops() const noexcept { return {}; }
  // A token for the work this rank has issued so far, for the others to wait on.
  [[nodiscard]] const void* publish(int /*phase*/) noexcept { return nullptr; }
  // Orders this rank's later work after the work behind another rank's token.
  void await(const void* /*token*/) noexcept {}
  // Waits for all of this rank's work; called when the rank's function returns.
  void finish() {}
};

}  // namespace detail

template <class Lane>
class BasicSimulatedBackend;

// The shared state of one simulated mesh: rendezvous, byte counters, and the abort flag that
// turns one rank's error into an error on every rank instead of a hang.
template <class Lane>
class BasicSimulatedWorld {
 public:
  explicit BasicSimulatedWorld(const DeviceMesh& mesh, typename Lane::Setting setting = {})
      : mesh_(mesh), setting_(setting), bytes_(static_cast<std::size_t>(mesh.size())) {}
  BasicSimulatedWorld(const BasicSimulatedWorld&) = delete;
  BasicSimulatedWorld& operator=(const BasicSimulatedWorld&) = delete;
  // Ends the ranks' threads.
  ~BasicSimulatedWorld() { close(); }

  [[nodiscard]] const DeviceMesh& mesh() const noexcept { return mesh_; }
  // Bytes global rank `rank` sent and received since the last reset.
  [[nodiscard]] RankBytes bytes(int rank) const {
    std::lock_guard lock(mutex_);
    return bytes_[static_cast<std::size_t>(mesh_.index_of(rank))];
  }
  // Collective calls (one per group, not per rank) and point-to-point rounds since the reset.
  [[nodiscard]] std::int64_t collectives() const {
    std::lock_guard lock(mutex_);
    return collectives_;
  }
  void reset_counters() {
    std::lock_guard lock(mutex_);
    for (RankBytes& b : bytes_) b = {};
    collectives_ = 0;
  }

  // Runs f(backend) for every rank of the mesh, each on its own thread, and waits for all
  // (and, on a device lane, for all their work on the device). The first error of any rank
  // aborts the others and is rethrown here. The threads start with the first run and are kept
  // for the next (one run at a time), so a world run many times starts its threads once.
  template <class F>
  void run(F&& f);

 private:
  friend class BasicSimulatedBackend<Lane>;

  // One rendezvous point: the members of a group deposit their arguments and a fence token,
  // wait for each other, work, and meet again before their buffers may change. Three fence
  // phases (enter, middle, leave), so that a member one meeting ahead never overwrites a token
  // another member has yet to read.
  struct Meeting {
    std::vector<const void*> send;
    std::vector<void*> recv;
    std::vector<std::size_t> size;
    std::vector<StridedPieces> pieces;                     // where an all-to-all's send pieces lie
    std::vector<std::span<const AllToAllPart>> parts;      // a batched all-to-all's
    std::vector<std::span<const AllGatherPart>> gathered;  // a batched all-gather's
    std::vector<std::vector<StridedSendMessage>> messages;
    std::array<std::vector<const void*>, 3> fence;
    int arrived = 0;
    std::atomic<std::uint64_t> generation = 0;
    // Wakes this group's members only: a world-wide one woke every waiting rank of every group
    // at each meeting, and the ranks' threads spent most of their time in the kernel.
    std::condition_variable met;
  };

  Meeting& meeting(int mesh_dim, int first_rank, int members) {
    std::lock_guard lock(mutex_);
    Meeting& m = meetings_[{mesh_dim, first_rank}];
    const auto n = static_cast<std::size_t>(members);
    if (m.send.size() != n) {
      m.send.resize(n);
      m.recv.resize(n);
      m.size.resize(n);
      m.pieces.resize(n);
      m.parts.resize(n);
      m.gathered.resize(n);
      m.messages.resize(n);
      for (auto& f : m.fence) f.resize(n);
    }
    return m;
  }

  void wait_all(Meeting& m, int members) {
    std::unique_lock lock(mutex_);
    const std::uint64_t generation = m.generation.load(std::memory_order_relaxed);
    if (++m.arrived == members) {
      m.arrived = 0;
      m.generation.fetch_add(1, std::memory_order_release);
      m.met.notify_all();
    } else {
      lock.unlock();
      for (int i = 0; i < 16 && m.generation.load(std::memory_order_acquire) == generation; ++i)
        std::this_thread::yield();
      lock.lock();
      m.met.wait(lock, [&] { return m.generation.load() != generation || aborted_; });
    }
    if (aborted_) throw error("simulated run aborted: another rank failed");
  }

  void count(int rank, std::int64_t send, std::int64_t recv, bool first_of_group) {
    std::lock_guard lock(mutex_);
    RankBytes& b = bytes_[static_cast<std::size_t>(mesh_.index_of(rank))];
    b.send += send;
    b.recv += recv;
    if (first_of_group) ++collectives_;
  }

  void abort() {
    std::lock_guard lock(mutex_);
    aborted_ = true;
    for (auto& [key, m] : meetings_) m.met.notify_all();
  }

  // One thread per rank, waiting for the first job; none if one cannot start.
  void start_threads() {
    try {
      threads_.reserve(static_cast<std::size_t>(mesh_.size()));
      for (int i = 0; i < mesh_.size(); ++i)
        threads_.emplace_back([this, i, done = runs_] { serve(i, done); });
    } catch (...) {
      close();
      throw;
    }
  }

  void close() {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    posted_.notify_all();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    closing_ = false;
  }

  // Rank index i's thread: runs each job posted after the `done`th run once, until the world
  // closes.
  void serve(int i, std::uint64_t done) {
    std::unique_lock lock(mutex_);
    while (true) {
      posted_.wait(lock, [&] { return closing_ || runs_ != done; });
      if (closing_) return;
      done = runs_;
      lock.unlock();
      job_(job_context_, i);
      lock.lock();
      if (--working_ == 0) finished_.notify_all();
    }
  }

  DeviceMesh mesh_;
  typename Lane::Setting setting_;
  mutable std::mutex mutex_;
  std::map<std::pair<int, int>, Meeting> meetings_;
  // The ranks' threads and the run they work on: job_(job_context_, rank index) on each, then
  // the last to finish wakes run().
  std::vector<std::thread> threads_;
  void (*job_)(void*, int) = nullptr;
  void* job_context_ = nullptr;
  std::uint64_t runs_ = 0;
  int working_ = 0;
  bool closing_ = false;
  std::condition_variable posted_;
  std::condition_variable finished_;
  std::vector<RankBytes> bytes_;
  std::int64_t collectives_ = 0;
  bool aborted_ = false;
};

// One rank's view of a BasicSimulatedWorld; satisfies Backend.
template <class Lane>
class BasicSimulatedBackend {
  using World = BasicSimulatedWorld<Lane>;
  using Meeting = typename World::Meeting;

 public:
  static constexpr MemorySpace memory = Lane::memory;

  BasicSimulatedBackend(World& world, Lane& lane, int rank)
      : world_(&world), lane_(&lane), rank_(rank) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] const DeviceMesh& mesh() const noexcept { return world_->mesh(); }
  // This rank's lane (its stream, on a device lane) and its local operations.
  [[nodiscard]] Lane& lane() const noexcept { return *lane_; }
  [[nodiscard]] decltype(auto) local_ops() const { return lane_->ops(); }

  void all_gather(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    const MeshGroup g = mesh().group(rank_, mesh_dim);
    Meeting& m = enter(g, mesh_dim, send, recv, bytes);
    for (int j = 0; j < g.size && bytes > 0; ++j) {
      std::byte* to = static_cast<std::byte*>(recv) + j * bytes;
      if (to != m.send[static_cast<std::size_t>(j)])  // in place: already there
        local_ops().copy(to, m.send[static_cast<std::size_t>(j)], bytes);
    }
    const auto moved = static_cast<std::int64_t>((g.size - 1) * bytes);
    leave(m, g, moved, moved);
  }

  void reduce_scatter(int mesh_dim, const void* send, void* recv, std::size_t count, DType dtype,
                      ReduceOp op) {
    const MeshGroup g = mesh().group(rank_, mesh_dim);
    Meeting& m = enter(g, mesh_dim, send, recv, count);
    const std::size_t elem = size_of(dtype);
    local_ops().reduce(dtype, recv,
                       member_sends(m, g, static_cast<std::size_t>(g.index) * count * elem), count,
                       op);
    const auto moved = static_cast<std::int64_t>((g.size - 1) * count * elem);
    leave(m, g, moved, moved);
  }

  void all_reduce(int mesh_dim, const void* send, void* recv, std::size_t count, DType dtype,
                  ReduceOp op) {
    const MeshGroup g = mesh().group(rank_, mesh_dim);
    Meeting& m = enter(g, mesh_dim, send, recv, count);
    const std::size_t elem = size_of(dtype);
    // Every member reduces all of it in the same order: bit-identical replicas. The result
    // goes to a private buffer first, since recv may be some member's send.
    auto result = local_ops().allocate(count * elem);
    local_ops().reduce(dtype, result.data(), member_sends(m, g, 0), count, op);
    sync(m, g, 1);
    local_ops().copy(recv, result.data(), count * elem);
    // Ring convention: a reduce-scatter of g balanced pieces, then an all-gather of them.
    const auto piece = static_cast<std::int64_t>(
        chunk_range(static_cast<std::int64_t>(count), g.size, g.index, ChunkPolicy::balanced).size);
    const auto moved = static_cast<std::int64_t>(
        ((g.size - 1) * piece + static_cast<std::int64_t>(count) - piece) *
        static_cast<std::int64_t>(elem));
    leave(m, g, moved, moved);
  }

  void all_to_all(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    const MeshGroup g = mesh().group(rank_, mesh_dim);
    const StridedPieces contiguous{1, bytes, static_cast<std::size_t>(g.size) * bytes};
    all_to_all_pieces(mesh_dim, send, recv, contiguous, contiguous);
  }

  // all_to_all with the pieces where they lie and where they go (StridedAllToAll): copied run
  // by run, the bytes counted as all_to_all's. On host memory only; a device lane packs, as
  // NCCL does.
  void all_to_all_strided(int mesh_dim, const void* send, void* recv, StridedPieces sent,
                          StridedPieces received) requires(Lane::memory == MemorySpace::host) {
    all_to_all_pieces(mesh_dim, send, recv, sent, received);
  }

  // all_to_all_strided over every part at once (BatchedAllToAll): each member's piece of each
  // part copied run by run, the bytes counted as one all_to_all's. On host memory only.
  void all_to_all_batched(int mesh_dim,
                          std::span<const AllToAllPart> parts) requires(Lane::memory ==
                                                                        MemorySpace::host) {
    const MeshGroup g = mesh().group(rank_, mesh_dim);
    std::size_t bytes = 0;
    for (const AllToAllPart& p : parts) bytes += p.sent.piece_bytes();
    Meeting& m = enter(g, mesh_dim, nullptr, nullptr, bytes);
    m.parts[static_cast<std::size_t>(g.index)] = parts;
    sync(m, g, 1);
    // Every member checks every pair, so that all agree, and meets the others before an error:
    // none reads another's parts after that one has left.
    std::string mismatch;
    for (int i = 0; i < g.size && mismatch.empty(); ++i)
      for (int j = 0; j < g.size && mismatch.empty(); ++j) {
        const std::span<const AllToAllPart> to = m.parts[static_cast<std::size_t>(i)];
        const std::span<const AllToAllPart> from = m.parts[static_cast<std::size_t>(j)];
        for (std::size_t t = 0; t < std::max(to.size(), from.size()) && mismatch.empty(); ++t) {
          const std::size_t want = t < to.size() ? to[t].received.piece_bytes() : 0;
          const std::size_t sent = t < from.size() ? from[t].sent.piece_bytes() : 0;
          if (want != sent)
            mismatch = "simulated batched all-to-all: rank " + std::to_string(g.rank(i)) +
                       " expects " + std::to_string(want) + " bytes of part " + std::to_string(t) +
                       " from rank " + std::to_string(g.rank(j)) + ", which sends " +
                       std::to_string(sent);
        }
      }
    refuse_together(m, g, mismatch);
    for (int j = 0; j < g.size; ++j) {
      const std::span<const AllToAllPart> theirs = m.parts[static_cast<std::size_t>(j)];
      for (std::size_t t = 0; t < parts.size(); ++t) {
        const std::size_t piece = parts[t].received.piece_bytes();
        if (piece == 0) continue;
        copy_runs(static_cast<const std::byte*>(theirs[t].send) +
                      static_cast<std::size_t>(g.index) * theirs[t].sent.run_bytes,
                  theirs[t].sent,
                  static_cast<std::byte*>(parts[t].recv) +
                      static_cast<std::size_t>(j) * parts[t].received.run_bytes,
                  parts[t].received, piece);
      }
    }
    const auto moved = static_cast<std::int64_t>(static_cast<std::size_t>(g.size - 1) * bytes);
    leave(m, g, moved, moved);
  }

  // all_gather_strided over every part at once (BatchedAllGather): each member's piece of each
  // part copied run by run to where it goes, the bytes counted as one all_gather's. On host
  // memory only.
  void all_gather_batched(int mesh_dim,
                          std::span<const AllGatherPart> parts) requires(Lane::memory ==
                                                                         MemorySpace::host) {
    const MeshGroup g = mesh().group(rank_, mesh_dim);
    std::size_t bytes = 0;
    for (const AllGatherPart& p : parts) bytes += p.received.piece_bytes();
    Meeting& m = enter(g, mesh_dim, nullptr, nullptr, bytes);
    m.gathered[static_cast<std::size_t>(g.index)] = parts;
    sync(m, g, 1);
    // Every member checks every member's parts against its own, so that all agree, and meets
    // the others before an error: none reads another's parts after that one has left.
    std::string mismatch;
    for (int j = 0; j < g.size && mismatch.empty(); ++j) {
      const std::span<const AllGatherPart> theirs = m.gathered[static_cast<std::size_t>(j)];
      const std::span<const AllGatherPart> first = m.gathered[0];
      for (std::size_t t = 0; t < std::max(first.size(), theirs.size()) && mismatch.empty(); ++t) {
        const std::size_t want = t < first.size() ? first[t].received.piece_bytes() : 0;
        const std::size_t sent = t < theirs.size() ? theirs[t].received.piece_bytes() : 0;
        if (want != sent)
          mismatch = "simulated batched all-gather: rank " + std::to_string(g.rank(0)) +
                     " gathers " + std::to_string(want) + " bytes per member of part " +
                     std::to_string(t) + ", rank " + std::to_string(g.rank(j)) + " " +
                     std::to_string(sent);
      }
    }
    refuse_together(m, g, mismatch);
    for (int j = 0; j < g.size; ++j) {
      const std::span<const AllGatherPart> theirs = m.gathered[static_cast<std::size_t>(j)];
      for (std::size_t t = 0; t < parts.size(); ++t) {
        const std::size_t piece = parts[t].received.piece_bytes();
        if (piece == 0) continue;  // (its buffers may be null)
        auto* to = static_cast<std::byte*>(parts[t].recv) +
                   static_cast<std::size_t>(j) * parts[t].received.run_bytes;
        if (theirs[t].send == to) continue;  // in place: already there
        copy_runs(theirs[t].send, {1, piece, piece}, to, parts[t].received, piece);
      }
    }
    const auto moved = static_cast<std::int64_t>(static_cast<std::size_t>(g.size - 1) * bytes);
    leave(m, g, moved, moved);
  }

  // all_gather with each member's piece copied run by run to where it goes in `recv`
  // (StridedAllGather), the bytes counted as all_gather's. On host memory only.
  void all_gather_strided(int mesh_dim, const void* send, void* recv,
                          StridedPieces pieces) requires(Lane::memory == MemorySpace::host) {
    const MeshGroup g = mesh().group(rank_, mesh_dim);
    const std::size_t bytes = pieces.piece_bytes();
    Meeting& m = enter(g, mesh_dim, send, recv, bytes, pieces);
    for (int j = 0; j < g.size && bytes > 0; ++j)
      copy_runs(m.send[static_cast<std::size_t>(j)], {1, bytes, bytes},
                static_cast<std::byte*>(recv) + static_cast<std::size_t>(j) * pieces.run_bytes,
                pieces, bytes);
    const auto moved = static_cast<std::int64_t>(static_cast<std::size_t>(g.size - 1) * bytes);
    leave(m, g, moved, moved);
  }

  void exchange(std::span<const SendMessage> sends, std::span<const RecvMessage> recvs) {
    const detail::StridedRound round = detail::as_strided(sends, recvs);
    exchange_messages(round.sends, round.recvs);
  }

  // exchange with each message where its runs lie (StridedExchange), copied run by run. On
  // host memory only; a device lane packs, as NCCL does.
  void exchange_strided(std::span<const StridedSendMessage> sends,
                        std::span<const StridedRecvMessage> recvs) requires(Lane::memory ==
                                                                            MemorySpace::host) {
    exchange_messages(sends, recvs);
  }

 private:
  // The n-th receive from a peer matches the n-th send from it to this rank, as MPI matches
  // them; only a host lane has strided messages (a contiguous one is one run: one copy).
  void exchange_messages(std::span<const StridedSendMessage> sends,
                         std::span<const StridedRecvMessage> recvs) {
    const DeviceMesh& mesh = this->mesh();
    const int n = mesh.size();
    const auto me = static_cast<std::size_t>(mesh.index_of(rank_));
    const MeshGroup all{mesh.first_rank(), 1, n, static_cast<int>(me)};
    Meeting& m = world_->meeting(-1, mesh.first_rank(), n);
    m.messages[me].assign(sends.begin(), sends.end());
    sync(m, all, 0);
    std::int64_t sent = 0, received = 0;
    for (const StridedSendMessage& s : sends)
      if (s.peer != rank_) sent += static_cast<std::int64_t>(s.runs.piece_bytes());
    std::vector<std::size_t> matched(static_cast<std::size_t>(n), 0);
    for (const StridedRecvMessage& r : recvs) {
      const auto peer = static_cast<std::size_t>(mesh.index_of(r.peer));
      const auto& theirs = m.messages[peer];
      const StridedSendMessage* match = nullptr;
      for (std::size_t k = 0, seen = 0; k < theirs.size() && match == nullptr; ++k)
        if (theirs[k].peer == rank_ && seen++ == matched[peer]) match = &theirs[k];
      const std::size_t bytes = r.runs.piece_bytes();
      if (match == nullptr || match->runs.piece_bytes() != bytes) {
        world_->abort();
        throw error("simulated exchange: rank " + std::to_string(rank_) + " expects " +
                    std::to_string(bytes) + " bytes from rank " + std::to_string(r.peer) +
                    ", which sends no such message");
      }
      ++matched[peer];
      copy_runs(match->data, match->runs, r.data, r.runs, bytes);
      if (r.peer != rank_) received += static_cast<std::int64_t>(bytes);
    }
    sync(m, all, 2);
    world_->count(rank_, sent, received, me == 0);
  }

  // After a batched collective's members compared their parts (each finds the same `mismatch`,
  // "" when they match): meets the group once more, so that none reads another's parts after
  // that one has left, then aborts the world with the mismatch.
  void refuse_together(Meeting& m, const MeshGroup& g, const std::string& mismatch) {
    if (mismatch.empty()) return;
    sync(m, g, 2);
    world_->abort();
    throw error(mismatch);
  }

  // Meets the group: deposits this rank's fence token for `phase`, waits for every member, and
  // orders this rank's later work after everything the members issued before meeting.
  void sync(Meeting& m, const MeshGroup& g, int phase) {
    auto& tokens = m.fence[static_cast<std::size_t>(phase)];
    tokens[static_cast<std::size_t>(g.index)] = lane_->publish(phase);
    world_->wait_all(m, g.size);
    for (int j = 0; j < g.size; ++j)
      if (j != g.index) lane_->await(tokens[static_cast<std::size_t>(j)]);
  }

  Meeting& enter(const MeshGroup& g, int mesh_dim, const void* send, void* recv, std::size_t size,
                 StridedPieces pieces = {}) {
    Meeting& m = world_->meeting(mesh_dim, g.first, g.size);
    const auto i = static_cast<std::size_t>(g.index);
    m.send[i] = send;
    m.recv[i] = recv;
    m.size[i] = size;
    m.pieces[i] = pieces;
    sync(m, g, 0);
    for (int j = 0; j < g.size; ++j) {
      if (m.size[static_cast<std::size_t>(j)] != size) {
        world_->abort();
        throw error("simulated collective: rank " + std::to_string(rank_) + " passes size " +
                    std::to_string(size) + ", rank " + std::to_string(g.rank(j)) + " " +
                    std::to_string(m.size[static_cast<std::size_t>(j)]));
      }
    }
    return m;
  }

  // An all-to-all whose send pieces lie as `sent` says (every member's may lie differently):
  // member j's piece for this rank goes, run by run, where `received` puts piece j of `recv`.
  void all_to_all_pieces(int mesh_dim, const void* send, void* recv, StridedPieces sent,
                         StridedPieces received) {
    const MeshGroup g = mesh().group(rank_, mesh_dim);
    const std::size_t bytes = sent.piece_bytes();
    Meeting& m = enter(g, mesh_dim, send, recv, bytes, sent);
    for (int j = 0; j < g.size && bytes > 0; ++j) {
      const StridedPieces& theirs = m.pieces[static_cast<std::size_t>(j)];
      const auto* from = static_cast<const std::byte*>(m.send[static_cast<std::size_t>(j)]) +
                         static_cast<std::size_t>(g.index) * theirs.run_bytes;
      copy_runs(from, theirs,
                static_cast<std::byte*>(recv) + static_cast<std::size_t>(j) * received.run_bytes,
                received, bytes);
    }
    const auto moved = static_cast<std::int64_t>(static_cast<std::size_t>(g.size - 1) * bytes);
    leave(m, g, moved, moved);
  }

  // Copies `bytes` bytes laid out as runs of `from_runs` (run r at r * stride_bytes of `from`)
  // into runs of `to_runs` at `to`: both sides are runs of the same bytes, cut differently, and
  // are walked together.
  void copy_runs(const void* from, StridedPieces from_runs, void* to, StridedPieces to_runs,
                 std::size_t bytes) const {
    detail::copy_runs([this](void* t, const void* f, std::size_t n) { local_ops().copy(t, f, n); },
                      from, from_runs, to, to_runs, bytes);
  }

  // Every member's send buffer, `offset` bytes in, in group order.
  static std::vector<const void*> member_sends(const Meeting& m, const MeshGroup& g,
                                               std::size_t offset) {
    std::vector<const void*> parts(static_cast<std::size_t>(g.size));
    for (std::size_t j = 0; j < parts.size(); ++j)
      parts[j] = static_cast<const std::byte*>(m.send[j]) + offset;
    return parts;
  }

  void leave(Meeting& m, const MeshGroup& g, std::int64_t sent, std::int64_t received) {
    sync(m, g, 2);
    world_->count(rank_, g.size > 1 ? sent : 0, g.size > 1 ? received : 0, g.index == 0);
  }

  World* world_;
  Lane* lane_;
  int rank_;
};

template <class Lane>
template <class F>
void BasicSimulatedWorld<Lane>::run(F&& f) {
  {
    std::lock_guard lock(mutex_);
    aborted_ = false;
    meetings_.clear();
  }
  // Every lane outlives every thread: a rank that finishes first must not free what another
  // still waits on (on a device lane, its events).
  const auto ranks = static_cast<std::size_t>(mesh_.size());
  std::vector<std::unique_ptr<Lane>> lanes;
  lanes.reserve(ranks);
  for (int i = 0; i < mesh_.size(); ++i) lanes.push_back(std::make_unique<Lane>(i, setting_));
  std::vector<std::exception_ptr> errors(ranks);
  auto work = [this, &f, &errors, &lanes](int i) {
    Lane& lane = *lanes[static_cast<std::size_t>(i)];
    try {
      lane.attach();
      BasicSimulatedBackend<Lane> backend(*this, lane, mesh_.rank_at(i));
      try {
        f(backend);
      } catch (...) {
        // Work already issued completes before the lane goes away.
        abort();
        try {
          lane.finish();
        } catch (...) {
        }
        throw;
      }
      lane.finish();
    } catch (...) {
      errors[static_cast<std::size_t>(i)] = std::current_exception();
      abort();
    }
  };
  if (threads_.empty()) start_threads();
  {
    std::unique_lock lock(mutex_);
    job_ = [](void* context, int i) { (*static_cast<decltype(work)*>(context))(i); };
    job_context_ = &work;
    working_ = mesh_.size();
    ++runs_;
    posted_.notify_all();
    finished_.wait(lock, [&] { return working_ == 0; });
  }
  // The root cause first: an error other than the abort it caused elsewhere.
  std::exception_ptr first;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    if (!first) first = e;
    try {
      std::rethrow_exception(e);
    } catch (const error& err) {
      if (std::string_view(err.what()).find("simulated run aborted") == std::string_view::npos) {
        first = e;
        break;
      }
    } catch (...) {
      first = e;
      break;
    }
  }
  if (first) std::rethrow_exception(first);
}

// All ranks of a mesh on host memory, one thread each.
using SimulatedWorld = BasicSimulatedWorld<detail::HostLane>;
// One rank of a SimulatedWorld.
using SimulatedBackend = BasicSimulatedBackend<detail::HostLane>;

}  // namespace dtensor
