#pragma once

// Only MPI's C interface: the deprecated C++ bindings are not needed and do not compile
// warning-free.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#ifdef __linux__
#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>
#endif

#include "../backend.hpp"
#include "../detail/elementwise.hpp"
#include "../device_mesh.hpp"
#include "../errors.hpp"

// The MPI backend: host buffers, one communicator per mesh dim for this rank's group (made
// with MPI_Comm_split), MPI's nonblocking collectives for the group steps and point-to-point
// for exchanges, all waited for by polling. Runs across machines. Errors come back as
// dtensor::error with the call's name and MPI's error string, not aborts; an error on one rank
// (or a wait past the timeout) aborts the backend on every rank, so that the others get an
// error instead of waiting forever for a rank that will not come.
namespace dtensor {

namespace detail {

// HostOps whose staging buffers outlive an abort: once the backend has aborted, a buffer that
// an abandoned operation may still use is kept rather than freed or reused.
class MpiHostOps : public HostOps {
 public:
  using Buffer = HostOps::Buffer;

  explicit MpiHostOps(const bool* aborted) : aborted_(aborted) {}
  [[nodiscard]] Buffer allocate(std::size_t bytes, bool zero = false) const {
    return Buffer(bytes, zero, aborted_);
  }

 private:
  const bool* aborted_;
};

// An MPI derived datatype, freed when it goes (unless MPI has been finalized); release()
// forgets it unfreed (an abandoned operation may still use it).
class MpiType {
 public:
  MpiType() = default;
  MpiType(MpiType&& other) noexcept : type_(std::exchange(other.type_, MPI_DATATYPE_NULL)) {}
  MpiType& operator=(MpiType&& other) noexcept {
    if (this != &other) {
      reset();
      type_ = std::exchange(other.type_, MPI_DATATYPE_NULL);
    }
    return *this;
  }
  MpiType(const MpiType&) = delete;
  MpiType& operator=(const MpiType&) = delete;
  ~MpiType() { reset(); }

  [[nodiscard]] MPI_Datatype get() const noexcept { return type_; }
  // Where MPI writes a new type (the old one freed first).
  [[nodiscard]] MPI_Datatype* out() noexcept {
    reset();
    return &type_;
  }
  // The type itself, for MPI_Type_commit.
  [[nodiscard]] MPI_Datatype* handle() noexcept { return &type_; }
  void reset() noexcept {
    if (type_ == MPI_DATATYPE_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) MPI_Type_free(&type_);
    type_ = MPI_DATATYPE_NULL;
  }
  void release() noexcept { type_ = MPI_DATATYPE_NULL; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

}  // namespace detail

// One rank of a mesh whose ranks are the ranks of an MPI communicator; satisfies Backend,
// AsyncBackend, StridedAllToAll, StridedAllGather, BatchedAllToAll and BatchedAllGather.
class MpiBackend {
 public:
  static constexpr MemorySpace memory = MemorySpace::host;
  // A batch's point-to-point round sends the messages of at least this size as they are rather
  // than packed per peer (execute_batch.hpp): shared memory moves them in one copy, from the
  // sender's buffer to the receiver's, where a packed one costs a pack and an unpack besides.
  static constexpr std::size_t direct_message_bytes = std::size_t{32} << 10;
  // A batch's all-to-all round of at least this many packed bytes (all members, all tensors)
  // runs from the tensors' buffers (all_to_all_batched), holding no scratch; a smaller one packs
  // both sides, since building a datatype per member and tensor costs more than copying it
  // (about 0.5 us per tensor and member here, bench/README.md).
  static constexpr std::size_t batched_all_to_all_bytes = std::size_t{512} << 10;
  // A batch's all-gather round of at least this many gathered bytes (all members, all tensors)
  // runs from the tensors' buffers (all_gather_batched, the same datatypes), holding no scratch
  // and sparing the unpacking copy of the gathered block; a smaller one packs.
  static constexpr std::size_t batched_all_gather_bytes = std::size_t{512} << 10;
  // By default, an even reduce-scatter of blocks of at least this size runs as one point-to-point
  // round reduced by dtensor in group order rather than MPI_Ireduce_scatter_block, and an
  // all-reduce as two (Options::reduce_by_messages_from_bytes): Open MPI 4.1 reduces 64 MiB
  // blocks 2 to 5 times slower than the rounds (bench/README.md, the MPI tables).
  static constexpr std::size_t reduce_messages_bytes = std::size_t{1} << 20;
  // By default, an all-gather or all-to-all of fewer bytes than this (the gathered block, or all
  // the pieces a member sends) runs as one point-to-point round, every piece sent straight from
  // where it lies to where it goes, rather than MPI_Iallgather or MPI_Ialltoall
  // (Options::move_by_messages_below_bytes): with a core per rank, Open MPI 4.1's nonblocking
  // all-gather took 1.2 to 2.3 times the blocking one's time from 4 KiB to 2 MiB gathered, where
  // the round takes about the blocking time (bench/README.md); from a few MiB the collective is
  // as fast or faster.
  static constexpr std::size_t move_messages_bytes = std::size_t{4} << 20;

  // Whether an all-to-all whose pieces are strided on one side (S(0) -> S(1), S(1) -> S(0))
  // moves them with the kernel's single copy between the ranks' buffers (Linux
  // process_vm_writev / process_vm_readv: rows written from 1 KiB and read from 512 B straight,
  // one iovec each, shorter ones packed or unpacked 64 KiB at a time in cache; a band of rows at a
  // time for every member) instead of MPI's derived datatypes, which Open MPI 4.1 moves through
  // copy-in/copy-out shared-memory fragments (two copies); so does a strided all-gather
  // (S(1) -> R) whose rows go straight (pulled through the staging buffer it ran slower than the
  // datatype, bench/README.md). Only where every member of the group runs on this machine and the
  // kernel lets them reach each other's memory. Blocking, or started with start_*
  // (execute_async): then the copies run in the test() that finds the members' addresses in.
  enum class SingleCopy : std::uint8_t {
    automatic,  // where the ranks on this machine have a core each (not oversubscribed)
    always,     // wherever it works (tests)
    never,
  };

  struct Options {
    // How long an operation may wait for its peers, counted from the first time the library
    // waits or polls for it, before this rank aborts the backend and throws.
    std::chrono::milliseconds timeout{std::chrono::minutes(10)};
    SingleCopy single_copy = SingleCopy::automatic;
    // The smallest all-to-all (bytes this rank sends, all members) that goes by single copy:
    // below it the two small collectives it adds cost more than they save.
    std::size_t single_copy_from_bytes = std::size_t{1} << 20;
    // Bytes of rows packed (or unpacked) and moved per kernel call of a single copy, in a
    // staging buffer meant to stay in cache.
    std::size_t single_copy_chunk_bytes = std::size_t{64} << 10;
    // Rows of at least this many bytes move by single copy straight between the buffers, one
    // iovec each (up to 1,024 per kernel call), without the staging buffer, which adds a second
    // copy: rows written into the peers' buffers (a strided send side) from 1 KiB, rows read from
    // them (a strided receive side, an all-gather's too) from 512 B. With 8 ranks on cores of
    // their own, 512-byte rows read straight ran faster than through MPI's datatype or the
    // staging, and written straight slower than staged (bench/README.md). A strided all-gather
    // goes by single copy only straight.
    std::size_t single_copy_direct_write_from_bytes = std::size_t{1} << 10;
    std::size_t single_copy_direct_read_from_bytes = 512;
    // The span of this rank's strided side (rows times their stride) whose pieces a single copy
    // moves for every member before the next rows, so that it stays in cache (member by member,
    // the strided side was crossed once per member: 1.3-1.5 times slower at 64 MiB).
    std::size_t single_copy_band_bytes = std::size_t{1} << 20;
    // Threads of this rank (itself one of them) that share the bands of one single copy that
    // moves at least single_copy_threads_from_bytes (this rank's side, every member): 0 for as
    // many as this rank has cores of its own, the fewer of the CPUs it may run on (its affinity)
    // and the machine's CPUs over its ranks there, at most 8; 1 for none. The kernel's copy
    // runs at the speed of one core: a bare MPI collective copies on one, and a rank given more
    // (mpirun --map-by slot:PE=2) reads its peers' pieces on each.
    unsigned single_copy_threads = 0;
    std::size_t single_copy_threads_from_bytes = std::size_t{1} << 20;
    // From how many bytes of block (the first rank's) an even reduce-scatter or an all-reduce
    // runs as point-to-point rounds reduced by dtensor instead of MPI's collective: 0 always,
    // SIZE_MAX never (an MPI whose reductions are fast, e.g. across machines). The same on
    // every rank; workspace_bytes(plan, backend) counts the scratch this choice takes.
    std::size_t reduce_by_messages_from_bytes = reduce_messages_bytes;
    // Below how many bytes (the gathered block, or all the pieces a member sends) an all-gather
    // or all-to-all that does not go by single copy runs as one point-to-point round instead of
    // MPI's collective: 0 never, SIZE_MAX always. The same on every rank (every member moves as
    // much). The same bytes either way, and no scratch.
    std::size_t move_by_messages_below_bytes = move_messages_bytes;
    // From how many bytes (all members, all tensors) a batch's all-to-all round, and its
    // all-gather round, run from the tensors' buffers (one MPI_Ialltoallw of derived datatypes)
    // instead of packing: SIZE_MAX never. The same on every rank; workspace_bytes(batch,
    // backend) counts the packing this choice takes.
    std::size_t batched_all_to_all_from_bytes = batched_all_to_all_bytes;
    std::size_t batched_all_gather_from_bytes = batched_all_gather_bytes;
  };

  // Every process of `world` constructs it (collective), and every one must be in `mesh`:
  // mesh.rank_at(i) are ranks of `world`.
  explicit MpiBackend(const DeviceMesh& mesh, MPI_Comm world = MPI_COMM_WORLD)
      : MpiBackend(mesh, world, Options{}) {}
  MpiBackend(const DeviceMesh& mesh, MPI_Comm world, Options options)
      : mesh_(mesh), options_(options), state_(std::make_unique<State>()) {
    State& st = *state_;
    // Duplicates, so that setting their error handler leaves the caller's communicator alone;
    // `control` carries abort notices, apart from all data.
    check(MPI_Comm_dup(world, &st.world), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(st.world, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    int size = 0;
    check(MPI_Comm_rank(st.world, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(st.world, &size), "MPI_Comm_size");
    if (size != mesh.size() || !mesh.contains(rank_)) {
      MPI_Comm_free(&st.world);
      throw error("MpiBackend: the communicator has " + std::to_string(size) +
                  " ranks, but the mesh has " + std::to_string(mesh.size()) +
                  " and must hold every one of them (rank " + std::to_string(rank_) + ")");
    }
    check(MPI_Comm_dup(st.world, &st.control), "MPI_Comm_dup");
    for (int k = 0; k < mesh.ndim(); ++k) {
      const MeshGroup g = mesh.group(rank_, k);
      MPI_Comm comm = MPI_COMM_NULL;
      check(MPI_Comm_split(st.world, g.first, g.index, &comm), "MPI_Comm_split");
      check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      st.groups.push_back(comm);
    }
    st.single_copies.assign(static_cast<std::size_t>(mesh.ndim()), 0);
    find_single_copy(options.single_copy);
    check(MPI_Irecv(st.notice_in, sizeof(st.notice_in), MPI_CHAR, MPI_ANY_SOURCE, notice_tag,
                    st.control, &st.notice_request),
          "MPI_Irecv");
  }

  MpiBackend(const MpiBackend&) = delete;
  MpiBackend& operator=(const MpiBackend&) = delete;
  // Not while executions are in flight on it.
  MpiBackend(MpiBackend&&) noexcept = default;
  MpiBackend& operator=(MpiBackend&&) = delete;
  ~MpiBackend() = default;

  // An operation in flight (start_*): its MPI requests, and what remains to do once they are
  // complete (f16 and bf16 results narrowed from float, avg divided).
  class Request {
   public:
    Request() = default;
    Request(Request&&) noexcept = default;
    Request& operator=(Request&& other) noexcept {
      if (this != &other) {
        abandon();
        requests_ = std::move(other.requests_);
        wide_in_ = std::move(other.wide_in_);
        wide_out_ = std::move(other.wide_out_);
        then_ = std::move(other.then_);
        keep_ = std::move(other.keep_);
        pieces_type_ = std::move(other.pieces_type_);
        recv_type_ = std::move(other.recv_type_);
        part_types_ = std::move(other.part_types_);
        counts_ = std::move(other.counts_);
        type_args_ = std::move(other.type_args_);
        deadline_ = other.deadline_;
        call_ = other.call_;
      }
      return *this;
    }
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;
    // A request destroyed unfinished was abandoned (after an abort): MPI may still use its
    // float copies.
    ~Request() { abandon(); }

   private:
    friend class MpiBackend;
    const char* call_ = "";
    std::vector<MPI_Request> requests_;
    HostOps::Buffer wide_in_, wide_out_;  // the float copies of an f16/bf16 reduction
    // Run once the requests complete; it may start the operation's next stage in the request
    // (more requests and another then_).
    std::function<void(Request&)> then_;
    std::shared_ptr<void> keep_;   // what MPI reads or writes until the requests complete
    detail::MpiType pieces_type_;  // a strided operation's pieces (StridedPieces)
    detail::MpiType recv_type_;    // a strided all-to-all's received pieces
    // A batched all-to-all's datatypes, and the arrays MPI_Ialltoallw reads until it completes.
    std::vector<detail::MpiType> part_types_;
    std::vector<int> counts_;
    std::vector<MPI_Datatype> type_args_;
    std::optional<std::chrono::steady_clock::time_point> deadline_;

    void abandon() noexcept {
      if (requests_.empty()) return;
      requests_.clear();
      pieces_type_.release();
      recv_type_.release();
      for (detail::MpiType& t : part_types_) t.release();
      wide_in_.abandon();
      wide_out_.abandon();
      if (keep_) {  // left to MPI, as the above: moved into a copy whose destructor never runs
        alignas(std::shared_ptr<void>) std::array<std::byte, sizeof(std::shared_ptr<void>)> kept{};
        new (kept.data()) std::shared_ptr<void>(std::move(keep_));
      }
    }
  };

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] const DeviceMesh& mesh() const noexcept { return mesh_; }
  [[nodiscard]] const Options& options() const noexcept { return options_; }
  // Host memory operations whose staging survives an abort (see abort()).
  [[nodiscard]] detail::MpiHostOps local_ops() const noexcept {
    return detail::MpiHostOps(&state_->aborted);
  }

  // The blocking operations (Backend): started, then waited for by polling, so that a timeout
  // or another rank's abort ends the wait.
  void all_gather(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    Request r = start_all_gather(mesh_dim, send, recv, bytes);
    wait(r);
  }
  void reduce_scatter(int mesh_dim, const void* send, void* recv, std::size_t count, DType dtype,
                      ReduceOp op) {
    Request r = start_reduce_scatter(mesh_dim, send, recv, count, dtype, op);
    wait(r);
  }
  void all_reduce(int mesh_dim, const void* send, void* recv, std::size_t count, DType dtype,
                  ReduceOp op) {
    Request r = start_all_reduce(mesh_dim, send, recv, count, dtype, op);
    wait(r);
  }
  void all_to_all(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    Request r = start_all_to_all(mesh_dim, send, recv, bytes);
    wait(r);
  }
  void exchange(std::span<const SendMessage> sends, std::span<const RecvMessage> recvs) {
    Request r = start_exchange(sends, recvs);
    wait(r);
  }
  void all_to_all_strided(int mesh_dim, const void* send, void* recv, StridedPieces sent,
                          StridedPieces received) {
    Request r = start_all_to_all_strided(mesh_dim, send, recv, sent, received);
    wait(r);
  }
  // From how many bytes of block reductions run by messages (Options).
  [[nodiscard]] std::size_t reduce_by_messages_from() const noexcept {
    return options_.reduce_by_messages_from_bytes;
  }
  // From how many bytes a batch's all-to-all and all-gather rounds run from the tensors'
  // buffers (Options).
  [[nodiscard]] std::size_t batched_all_to_all_from() const noexcept {
    return options_.batched_all_to_all_from_bytes;
  }
  [[nodiscard]] std::size_t batched_all_gather_from() const noexcept {
    return options_.batched_all_gather_from_bytes;
  }
  // Whether the group of mesh dim k moves strided all-to-alls by single copy (Options).
  [[nodiscard]] bool single_copy(int mesh_dim) const {
    return state_->single_copy[static_cast<std::size_t>(mesh_dim)] != 0;
  }
  // How many threads of this rank share a large single copy (Options::single_copy_threads, 0
  // resolved; 1 under SingleCopy::never, where none runs).
  [[nodiscard]] unsigned single_copy_threads() const noexcept { return state_->copy_threads; }
  void all_gather_strided(int mesh_dim, const void* send, void* recv, StridedPieces pieces) {
    Request r = start_all_gather_strided(mesh_dim, send, recv, pieces);
    wait(r);
  }
  void exchange_strided(std::span<const StridedSendMessage> sends,
                        std::span<const StridedRecvMessage> recvs) {
    Request r = start_exchange_strided(sends, recvs);
    wait(r);
  }
  // One all-to-all over several tensors' buffers (BatchedAllToAll): MPI_Ialltoallw with, for
  // each member, one datatype on each side that picks its piece of every part where it lies
  // (absolute addresses from MPI_BOTTOM), so nothing is packed.
  void all_to_all_batched(int mesh_dim, std::span<const AllToAllPart> parts) {
    Request r = start_all_to_all_batched(mesh_dim, parts);
    wait(r);
  }
  // One all-gather over several tensors' buffers (BatchedAllGather): the same MPI_Ialltoallw,
  // each member sending its piece of every part where it lies and receiving every member's
  // where it goes.
  void all_gather_batched(int mesh_dim, std::span<const AllGatherPart> parts) {
    Request r = start_all_gather_batched(mesh_dim, parts);
    wait(r);
  }

  // The same operations started and finished later (AsyncBackend), with MPI's nonblocking
  // collectives: execute_async overlaps them with the caller's work. A collective of no element
  // starts nothing and is complete at once: every member of the group passes the same count, so
  // all of them skip it (the planner costs it nothing).
  Request start_all_gather(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    if (bytes == 0) return begin("MPI_Iallgather");
    const MeshGroup grp = mesh_.group(rank_, mesh_dim);
    if (by_messages(grp, bytes))
      return start_all_gather_by_messages(mesh_dim, grp, send, recv, bytes);
    Request r = begin("MPI_Iallgather");
    const int n = count_of(bytes, r.call_);
    const auto index = static_cast<std::size_t>(grp.index);
    const bool in_place = send == static_cast<const std::byte*>(recv) + index * bytes;
    must(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, MPI_BYTE, recv, n, MPI_BYTE,
                        group(mesh_dim), &r.requests_.emplace_back()),
         r.call_);
    return r;
  }
  Request start_reduce_scatter(int mesh_dim, const void* send, void* recv, std::size_t count,
                               DType dtype, ReduceOp op) {
    Request r = begin("MPI_Ireduce_scatter_block");
    if (count == 0) return r;
    reduce(send, recv, count, dtype, op, mesh_dim, true, r);
    return r;
  }
  Request start_all_reduce(int mesh_dim, const void* send, void* recv, std::size_t count,
                           DType dtype, ReduceOp op) {
    Request r = begin("MPI_Iallreduce");
    if (count == 0) return r;
    reduce(send, recv, count, dtype, op, mesh_dim, false, r);
    return r;
  }
  Request start_all_to_all(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    if (bytes == 0) return begin("MPI_Ialltoall");
    const MeshGroup grp = mesh_.group(rank_, mesh_dim);
    if (by_messages(grp, bytes)) {
      const StridedPieces slabs{1, bytes, bytes * static_cast<std::size_t>(grp.size)};
      return start_all_to_all_by_messages(grp, send, slabs, recv, slabs, false);
    }
    Request r = begin("MPI_Ialltoall");
    const int n = count_of(bytes, r.call_);
    must(MPI_Ialltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, group(mesh_dim),
                       &r.requests_.emplace_back()),
         r.call_);
    return r;
  }
  // An all-to-all whose pieces MPI reads where they lie and writes where they go
  // (StridedAllToAll): a derived datatype (pieces_type) for each strided side, freed once
  // finished.
  Request start_all_to_all_strided(int mesh_dim, const void* send, void* recv, StridedPieces sent,
                                   StridedPieces received) {
    if (sent.piece_bytes() == 0) return begin("MPI_Ialltoall");
    const bool strided_send = needs_type(sent), strided_recv = needs_type(received);
    if (!strided_send && !strided_recv)  // contiguous pieces, or none
      return start_all_to_all(mesh_dim, send, recv, sent.piece_bytes());
    const MeshGroup grp = mesh_.group(rank_, mesh_dim);
    const auto me = static_cast<std::size_t>(grp.index);
    if (strided_send && !strided_recv && goes_by_single_copy(mesh_dim, sent))
      // Pushed: this rank's strided pieces written into every member's target.
      return start_single_copy(mesh_dim, true, recv, me * sent.piece_bytes(), send, recv, sent);
    if (!strided_send && strided_recv && goes_by_single_copy(mesh_dim, received))
      // Pulled: every member's contiguous piece for this rank read into its strided place.
      return start_single_copy(mesh_dim, false, send, me * received.piece_bytes(), nullptr, recv,
                               received);
    if (by_messages(grp, sent.piece_bytes()))
      return start_all_to_all_by_messages(grp, send, sent, recv, received, false);
    Request r = begin("MPI_Ialltoall");
    const MPI_Comm comm = group(mesh_dim);
    const int n = count_of(sent.piece_bytes(), r.call_);
    if (strided_send) pieces_type(sent, r.pieces_type_, r);
    if (strided_recv) pieces_type(received, r.recv_type_, r);
    must(MPI_Ialltoall(send, strided_send ? 1 : n, strided_send ? r.pieces_type_.get() : MPI_BYTE,
                       recv, strided_recv ? 1 : n, strided_recv ? r.recv_type_.get() : MPI_BYTE,
                       comm, &r.requests_.emplace_back()),
         r.call_);
    return r;
  }
  // An all-gather whose pieces MPI writes where they go (StridedAllGather): the same datatype
  // as a strided all-to-all's, on the receive side.
  Request start_all_gather_strided(int mesh_dim, const void* send, void* recv,
                                   StridedPieces pieces) {
    if (pieces.piece_bytes() == 0) return begin("MPI_Iallgather");
    if (!needs_type(pieces)) return start_all_gather(mesh_dim, send, recv, pieces.piece_bytes());
    if (pieces.run_bytes >= options_.single_copy_direct_read_from_bytes &&
        goes_by_single_copy(mesh_dim, pieces))
      // Pulled: every member's contiguous piece read straight into its strided place.
      return start_single_copy(mesh_dim, false, send, 0, nullptr, recv, pieces);
    const MeshGroup grp = mesh_.group(rank_, mesh_dim);
    if (by_messages(grp, pieces.piece_bytes())) {
      // This rank's piece (contiguous) to every member, every member's to where it goes.
      const StridedPieces whole{1, pieces.piece_bytes(), pieces.piece_bytes()};
      return start_all_to_all_by_messages(grp, send, whole, recv, pieces, true);
    }
    Request r = begin("MPI_Iallgather");
    const MPI_Comm comm = group(mesh_dim);
    const int n = pieces_type(pieces, r.pieces_type_, r);
    must(MPI_Iallgather(send, n, MPI_BYTE, recv, 1, r.pieces_type_.get(), comm,
                        &r.requests_.emplace_back()),
         r.call_);
    return r;
  }
  Request start_all_to_all_batched(int mesh_dim, std::span<const AllToAllPart> parts) {
    return start_batched(mesh_dim, parts.size(), [&](bool receive, std::size_t j, std::size_t t) {
      const AllToAllPart& p = parts[t];
      const StridedPieces runs = receive ? p.received : p.sent;
      if (runs.piece_bytes() == 0) return BatchedPiece{};  // (its buffers may be null)
      return BatchedPiece{
          static_cast<const std::byte*>(receive ? p.recv : p.send) + j * runs.run_bytes, runs};
    });
  }
  // The same for an all-gather (BatchedAllGather): every member's send datatype picks its own
  // piece of every part (the same for all members; for itself, only the parts not in place), and
  // its receive datatype from member j puts member j's piece of every part where it goes.
  Request start_all_gather_batched(int mesh_dim, std::span<const AllGatherPart> parts) {
    const auto me = static_cast<std::size_t>(mesh_.group(rank_, mesh_dim).index);
    return start_batched(mesh_dim, parts.size(), [&](bool receive, std::size_t j, std::size_t t) {
      const AllGatherPart& p = parts[t];
      const StridedPieces runs = p.received;
      if (runs.piece_bytes() == 0) return BatchedPiece{};  // (its buffers may be null)
      auto* slot = static_cast<std::byte*>(p.recv) + j * runs.run_bytes;
      if (j == me && p.send == slot && !needs_type(runs)) return BatchedPiece{};  // in place
      if (receive) return BatchedPiece{slot, runs};
      return BatchedPiece{p.send, {1, runs.piece_bytes(), runs.piece_bytes()}};
    });
  }
  Request start_exchange(std::span<const SendMessage> sends, std::span<const RecvMessage> recvs) {
    const detail::StridedRound round = detail::as_strided(sends, recvs);
    return start_exchange_strided(round.sends, round.recvs);
  }
  // A point-to-point round whose messages MPI reads and writes where their runs lie
  // (StridedExchange): a strided message goes as one MPI_Type_create_hvector datatype, freed
  // once finished.
  Request start_exchange_strided(std::span<const StridedSendMessage> sends,
                                 std::span<const StridedRecvMessage> recvs) {
    constexpr int tag = 0x6474;  // "dt"
    Request request = begin("MPI_Isend/MPI_Irecv");
    // Everything that can be refused is refused before anything is posted: sizes MPI can
    // count, and a send to itself for each receive from itself, in order.
    for (const StridedSendMessage& m : sends) count_of(m.runs.piece_bytes(), "MPI_Isend");
    for (const StridedRecvMessage& m : recvs) count_of(m.runs.piece_bytes(), "MPI_Irecv");
    std::vector<std::pair<const StridedRecvMessage*, const StridedSendMessage*>> self_copies;
    std::size_t next_self = 0;
    for (const StridedRecvMessage& r : recvs) {
      if (r.peer != rank_ || r.runs.piece_bytes() == 0) continue;
      while (next_self < sends.size() &&
             (sends[next_self].peer != rank_ || sends[next_self].runs.piece_bytes() == 0))
        ++next_self;
      if (next_self == sends.size() || sends[next_self].runs.piece_bytes() != r.runs.piece_bytes())
        throw error("MpiBackend::exchange: a receive from itself has no matching send");
      self_copies.emplace_back(&r, &sends[next_self++]);
    }
    std::vector<MPI_Request>& requests = request.requests_;
    requests.reserve(sends.size() + recvs.size());
    const MPI_Comm world = state_->world;
    // One contiguous run goes as bytes, more as a datatype of its runs: one per shape of runs
    // (an all-to-all's pieces share theirs), built and committed once.
    std::vector<std::pair<StridedPieces, MPI_Datatype>> built;
    auto type_of = [&](StridedPieces runs, const char* call, int& count) {
      count = count_of(runs.piece_bytes(), call);
      if (!needs_type(runs)) return MPI_Datatype{MPI_BYTE};
      count = 1;
      for (const auto& [shape, type] : built)
        if (shape.rows == runs.rows && shape.run_bytes == runs.run_bytes &&
            shape.stride_bytes == runs.stride_bytes)
          return type;
      detail::MpiType& t = request.part_types_.emplace_back();
      runs_type(runs, t, call);
      must(MPI_Type_commit(t.handle()), "MPI_Type_commit");
      built.emplace_back(runs, t.get());
      return t.get();
    };
    for (const StridedRecvMessage& r : recvs)
      if (r.peer != rank_ && r.runs.piece_bytes() != 0) {
        int count = 0;
        const MPI_Datatype type = type_of(r.runs, "MPI_Irecv", count);
        must(MPI_Irecv(r.data, count, type, r.peer, tag, world, &requests.emplace_back()),
             "MPI_Irecv");
      }
    for (const StridedSendMessage& m : sends)
      if (m.peer != rank_ && m.runs.piece_bytes() != 0) {
        int count = 0;
        const MPI_Datatype type = type_of(m.runs, "MPI_Isend", count);
        must(MPI_Isend(m.data, count, type, m.peer, tag, world, &requests.emplace_back()),
             "MPI_Isend");
      }
    for (const auto& [to, from] : self_copies)
      detail::copy_runs([](void* t, const void* f, std::size_t n) { std::memcpy(t, f, n); },
                        from->data, from->runs, to->data, to->runs, to->runs.piece_bytes());
    return request;
  }

  // Whether `r` has finished; finishes it if so. Throws when another rank has aborted, or when
  // `r` has been waited for longer than Options::timeout (aborting the backend).
  bool test(Request& r) {
    check_notices();
    int flag = 1;
    if (!r.requests_.empty())
      must(MPI_Testall(static_cast<int>(r.requests_.size()), r.requests_.data(), &flag,
                       MPI_STATUSES_IGNORE),
           "MPI_Testall");
    if (flag != 0) {
      finish(r);
      return r.requests_.empty();  // else the operation's next stage has started
    }
    const auto now = std::chrono::steady_clock::now();
    if (!r.deadline_) r.deadline_ = now + options_.timeout;
    if (now > *r.deadline_) {
      const std::string why = std::string(r.call_) + " did not complete within " +
                              std::to_string(options_.timeout.count()) + " ms on rank " +
                              std::to_string(rank_);
      abort(why);
      throw error("MpiBackend: " + why + "; the backend is aborted on every rank");
    }
    return false;
  }
  // Waits until `r` has finished (polling: see test()), advancing the executions in flight on
  // this thread meanwhile: a single copy of theirs moves on only when polled, and another rank's
  // wait may need it (it may wait for that execution before starting what `r` needs).
  void wait(Request& r) {
    while (!test(r)) detail::advance_any();
  }

  // Ends this backend on every rank after an error here: the other ranks get a dtensor::error
  // naming this rank and `why` from their next operation (or the one they are waiting in)
  // instead of waiting for this rank. Every later call on the backend throws; make a new one to
  // go on. execute() calls it when a run fails on this rank. MPI cannot cancel a collective it
  // has started, so operations in flight at the abort are abandoned, not stopped: the library
  // keeps its own staging alive for them, and the caller must keep the source and target
  // buffers of the failed runs allocated until MPI_Finalize.
  void abort(std::string_view why) noexcept {
    State& st = *state_;
    if (st.aborted) return;
    st.aborted = true;
    st.reason = "rank " + std::to_string(rank_) + " failed: " + std::string(why);
    const std::size_t n = std::min(st.reason.size(), sizeof(st.notice_in) - 1);
    for (int peer = 0; peer < mesh_.size(); ++peer) {
      if (peer == rank_) continue;
      MPI_Request& sent = st.notices_out.emplace_back();
      if (MPI_Isend(st.reason.data(), static_cast<int>(n), MPI_CHAR, peer, notice_tag, st.control,
                    &sent) != MPI_SUCCESS)
        st.notices_out.pop_back();
    }
  }
  // Whether the backend was aborted (here or on another rank), and why.
  [[nodiscard]] bool aborted() const noexcept { return state_->aborted; }
  [[nodiscard]] const std::string& abort_reason() const noexcept { return state_->reason; }

  // The executions in flight on this backend (execute_async keeps them in order).
  [[nodiscard]] ExecutionQueue& executions() noexcept { return state_->executions; }

 private:
  static constexpr int notice_tag = 0x6461;  // "da"

  // The communicators, ops and abort state, on the heap so that a move leaves MPI's pointers
  // (the posted notice receive) valid.
  struct State {
    MPI_Comm world = MPI_COMM_NULL, control = MPI_COMM_NULL;
    std::vector<MPI_Comm> groups;
    // Per mesh dim: whether its strided all-to-alls go by single copy, and the process ids of
    // its group's members (find_single_copy).
    std::vector<char> single_copy;
    std::vector<std::vector<int>> pids;
    // Per mesh dim: the single copies started on its group (their tags, start_single_copy).
    std::vector<unsigned> single_copies;
    // Threads that share a large single copy (Options::single_copy_threads, find_single_copy).
    unsigned copy_threads = 1;
    // Reduction ops per element type (by detail::dtype_index) and ReduceOp, made on first use.
    MPI_Op ops[8][5] = {};
    ExecutionQueue executions;
    // Abort notices: one receive always posted; what this rank sent.
    char notice_in[512] = {};
    MPI_Request notice_request = MPI_REQUEST_NULL;
    std::vector<MPI_Request> notices_out;
    bool aborted = false;
    std::string reason;

    State() {
      for (auto& row : ops)
        for (MPI_Op& op : row) op = MPI_OP_NULL;
    }
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State() {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized != 0) return;
      if (notice_request != MPI_REQUEST_NULL) {
        MPI_Cancel(&notice_request);
        MPI_Request_free(&notice_request);
      }
      // Notices are small: delivered at once. Whatever is left is not waited for.
      for (MPI_Request& r : notices_out)
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      for (auto& row : ops)
        for (MPI_Op& op : row)
          if (op != MPI_OP_NULL) MPI_Op_free(&op);
      for (MPI_Comm& c : groups)
        if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
      if (control != MPI_COMM_NULL) MPI_Comm_free(&control);
      if (world != MPI_COMM_NULL) MPI_Comm_free(&world);
    }
  };

  // Whether an all-gather or all-to-all of `bytes` per member goes as one point-to-point round
  // (Options::move_by_messages_below_bytes).
  [[nodiscard]] bool by_messages(const MeshGroup& grp, std::size_t bytes) const noexcept {
    const std::size_t below = options_.move_by_messages_below_bytes;  // bytes * size < below
    return below != 0 && bytes <= (below - 1) / static_cast<std::size_t>(grp.size);
  }
  // An all-to-all as one point-to-point round (StridedExchange's): piece j of `send`, laid out as
  // `sent` says, to member j, and member j's piece to where `received` puts piece j in `recv`;
  // each member in ring order from this one. With `gather`, `send` is one piece, sent to every
  // member (an all-gather's).
  Request start_all_to_all_by_messages(const MeshGroup& grp, const void* send, StridedPieces sent,
                                       void* recv, StridedPieces received, bool gather) {
    std::vector<StridedSendMessage> sends;
    std::vector<StridedRecvMessage> recvs;
    sends.reserve(static_cast<std::size_t>(grp.size));
    recvs.reserve(static_cast<std::size_t>(grp.size));
    for (int s = 0; s < grp.size; ++s) {
      const auto to = static_cast<std::size_t>((grp.index + s) % grp.size);
      const auto from = static_cast<std::size_t>((grp.index - s + grp.size) % grp.size);
      sends.push_back({grp.rank(static_cast<int>(to)),
                       static_cast<const std::byte*>(send) + (gather ? 0 : to * sent.run_bytes),
                       sent});
      recvs.push_back({grp.rank(static_cast<int>(from)),
                       static_cast<std::byte*>(recv) + from * received.run_bytes, received});
    }
    return start_exchange_strided(sends, recvs);
  }
  // An all-gather of contiguous pieces as one point-to-point round on the group's communicator
  // (Options::move_by_messages_below_bytes): every other member's piece received straight into
  // its place, this rank's piece sent to every other member, in ring order from each. (A strided
  // one goes through start_all_to_all_by_messages; this, the common case, builds no message
  // lists and copies nothing when the source is in place.)
  Request start_all_gather_by_messages(int mesh_dim, const MeshGroup& grp, const void* send,
                                       void* recv, std::size_t bytes) {
    constexpr int tag = 0x6761;  // "ga"
    Request r = begin("MPI_Isend/MPI_Irecv of an all-gather");
    const int n = count_of(bytes, r.call_);
    const MPI_Comm comm = group(mesh_dim);
    const int g = grp.size, me = grp.index;
    auto* out = static_cast<std::byte*>(recv);
    auto slot = [&](int j) { return out + static_cast<std::size_t>(j) * bytes; };
    if (bytes == 0) return r;
    r.requests_.reserve(2 * static_cast<std::size_t>(g - 1));
    for (int s = 1; s < g; ++s) {
      const int from = (me - s + g) % g;
      must(MPI_Irecv(slot(from), n, MPI_BYTE, from, tag, comm, &r.requests_.emplace_back()),
           "MPI_Irecv");
    }
    for (int s = 1; s < g; ++s)
      must(MPI_Isend(send, n, MPI_BYTE, (me + s) % g, tag, comm, &r.requests_.emplace_back()),
           "MPI_Isend");
    if (send != slot(me)) std::memcpy(slot(me), send, bytes);
    return r;
  }
  // A new request for `call`, once the backend is known to be usable.
  Request begin(const char* call) {
    check_notices();
    Request r;
    r.call_ = call;
    return r;
  }

  // Throws if the backend was aborted, here or (a notice arrived) on another rank.
  void check_notices() {
    State& st = *state_;
    if (!st.aborted && st.notice_request != MPI_REQUEST_NULL) {
      int arrived = 0;
      MPI_Status status;
      if (MPI_Test(&st.notice_request, &arrived, &status) == MPI_SUCCESS && arrived != 0) {
        int length = 0;
        MPI_Get_count(&status, MPI_CHAR, &length);
        st.aborted = true;
        st.reason = std::string(st.notice_in, static_cast<std::size_t>(std::max(length, 0)));
      }
    }
    if (st.aborted) throw error("MpiBackend aborted: " + st.reason);
  }

  // check() for a call on a working backend: a failed call aborts it first (see abort()).
  void must(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    try {
      check(rc, call);
    } catch (const error& e) {
      abort(e.what());
      throw;
    }
  }

  // Throws dtensor::error naming the MPI call and its error string.
  static void check(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(rc, text, &length);
    throw error(std::string(call) +
                " failed: " + std::string(text, static_cast<std::size_t>(length)));
  }

  static int count_of(std::size_t n, const char* call) {
    if (n > static_cast<std::size_t>(INT_MAX))
      throw error(std::string(call) + ": " + std::to_string(n) +
                  " elements exceed MPI's int counts");
    return static_cast<int>(n);
  }

  [[nodiscard]] MPI_Comm group(int mesh_dim) const {
    if (mesh_dim < 0 || mesh_dim >= mesh_.ndim())
      throw error("mesh dim " + std::to_string(mesh_dim) + " is out of range for a mesh of " +
                  std::to_string(mesh_.ndim()) + " dims");
    return state_->groups[static_cast<std::size_t>(mesh_dim)];
  }

  // inout[i] = in[i] op inout[i] with dtensor's own arithmetic (saturating integer sums, NaN
  // propagating max and min), so MPI and the simulated backend agree.
  template <class T, ReduceOp Op>
  // NOLINTNEXTLINE(readability-non-const-parameter): MPI_User_function's signature
  static void combine_op(void* in, void* inout, int* len, MPI_Datatype* /*datatype*/) {
    const T* a = static_cast<const T*>(in);
    T* b = static_cast<T*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = detail::combine(a[i], b[i], Op);
  }

  template <class T>
  MPI_Op op_for(ReduceOp op) {
    MPI_Op& slot = state_->ops[static_cast<int>(detail::dtype_index<T>())][static_cast<int>(op)];
    if (slot != MPI_OP_NULL) return slot;
    MPI_User_function* f = nullptr;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: f = &combine_op<T, ReduceOp::sum>; break;
      case ReduceOp::max: f = &combine_op<T, ReduceOp::max>; break;
      case ReduceOp::min: f = &combine_op<T, ReduceOp::min>; break;
      case ReduceOp::product: f = &combine_op<T, ReduceOp::product>; break;
    }
    must(MPI_Op_create(f, 1, &slot), "MPI_Op_create");
    return slot;
  }

  template <class T>
  static MPI_Datatype mpi_type() {
    if constexpr (std::is_same_v<T, float>)
      return MPI_FLOAT;
    else if constexpr (std::is_same_v<T, double>)
      return MPI_DOUBLE;
    else if constexpr (std::is_same_v<T, std::int32_t>)
      return MPI_INT32_T;
    else if constexpr (std::is_same_v<T, std::int64_t>)
      return MPI_INT64_T;
    else
      return MPI_UINT8_T;
  }

  // Whether the pieces need a datatype: not contiguous one after another, nor empty.
  // Decides, per mesh dim, whether strided all-to-alls go by single copy (Options::SingleCopy),
  // with every rank of the world: all members of the group on this machine, each able to read
  // the next member's memory (a probe), and, when automatic, no more ranks of the world on this
  // machine than it has cores.
  void find_single_copy(SingleCopy mode) {
    State& st = *state_;
    st.single_copy.assign(st.groups.size(), 0);
    st.pids.assign(st.groups.size(), {});
#ifdef __linux__
    if (mode == SingleCopy::never) return;
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(st.world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
          "MPI_Comm_split_type");
    int on_node = 0;
    MPI_Comm_size(node, &on_node);
    MPI_Comm_free(&node);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const bool roomy = mode == SingleCopy::always || cores >= on_node;
    st.copy_threads = options_.single_copy_threads;
    if (st.copy_threads == 0) {
      cpu_set_t allowed;
      CPU_ZERO(&allowed);
      const long mine =
          sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 1;
      st.copy_threads =
          static_cast<unsigned>(std::clamp(std::min(mine, cores / std::max(1, on_node)), 1L, 8L));
    }
    const int pid = static_cast<int>(getpid());
    for (std::size_t k = 0; k < st.groups.size(); ++k) {
      const MPI_Comm comm = st.groups[k];
      int g = 0, me = 0;
      MPI_Comm_size(comm, &g);
      MPI_Comm_rank(comm, &me);
      node = MPI_COMM_NULL;
      check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
      int local = 0;
      MPI_Comm_size(node, &local);
      MPI_Comm_free(&node);
      std::vector<int> pids(static_cast<std::size_t>(g));
      check(MPI_Allgather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, comm), "MPI_Allgather");
      // The probe: each member reads the next one's value, which names that member.
      const std::uint64_t mine = 0x64746e73ULL * 1000 + static_cast<std::uint64_t>(me);
      const auto at = reinterpret_cast<std::uintptr_t>(&mine);
      std::vector<std::uintptr_t> probes(static_cast<std::size_t>(g));
      check(MPI_Allgather(&at, sizeof at, MPI_BYTE, probes.data(), sizeof at, MPI_BYTE, comm),
            "MPI_Allgather");
      int ok = local == g && roomy ? 1 : 0;
      if (ok != 0 && g > 1) {
        const int next = (me + 1) % g;
        std::uint64_t seen = 0;
        iovec here{&seen, sizeof seen};
        // NOLINTNEXTLINE(performance-no-int-to-ptr): the next member's address, read by the kernel
        iovec there{reinterpret_cast<void*>(probes[static_cast<std::size_t>(next)]), sizeof seen};
        ok = process_vm_readv(pids[static_cast<std::size_t>(next)], &here, 1, &there, 1, 0) ==
                         static_cast<ssize_t>(sizeof seen) &&
                     seen == 0x64746e73ULL * 1000 + static_cast<std::uint64_t>(next)
                 ? 1
                 : 0;
      }
      check(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
      st.single_copy[k] = static_cast<char>(ok != 0 && g > 1);
      st.pids[k] = std::move(pids);
    }
#else
    static_cast<void>(mode);
#endif
  }
  // Whether a strided all-to-all on mesh dim k moving `runs` (its strided side)
  // goes by single copy: the group can (find_single_copy) and this rank moves at least
  // Options::single_copy_from_bytes.
  [[nodiscard]] bool goes_by_single_copy(int k, StridedPieces runs) const {
    const auto g = static_cast<std::size_t>(mesh_.size(k));
    return single_copy(k) && runs.piece_bytes() * g >= options_.single_copy_from_bytes;
  }
  // A single copy in flight: what it moves (start_single_copy's arguments), the members'
  // addresses, whether this rank's copies succeeded (and the errno when not), and every other
  // member's word on theirs.
  struct SingleCopyRun {
    int k = 0;
    bool push = false;
    const void* exposed = nullptr;
    std::size_t remote_offset = 0;
    const void* local_in = nullptr;
    void* local_out = nullptr;
    StridedPieces runs;
    std::uintptr_t mine = 0;
    std::vector<std::uintptr_t> where;
    int ok = 1;
    int failure = 0;
    std::vector<int> words;
  };
  // Tags of the single copies' words on the control communicator (1 to this), one per single
  // copy of a group in turn; the abort notices' tag lies above.
  static constexpr unsigned single_copy_tags = 16384;

  // Starts one strided all-to-all (or, pulling with `remote_offset` 0, all-gather) by single
  // copy: every member's address of `exposed` gathered (MPI_Iallgather); once they are in, the
  // next test() makes this rank's copies (single_copy_rows) and sends every member of the group
  // whether they succeeded, point to point under a tag of this copy's own (copies in flight on
  // one group may get there in another order on another rank); once every member's word is in,
  // the operation ends, and throws if a copy failed anywhere. A member's word also tells it that
  // every copy into or out of its buffers is done.
  Request start_single_copy(int k, bool push, const void* exposed, std::size_t remote_offset,
                            const void* local_in, void* local_out, StridedPieces runs) {
    Request r = begin("MPI_Iallgather");
#ifdef __linux__
    const auto g = static_cast<std::size_t>(mesh_.size(k));
    auto sc = std::make_shared<SingleCopyRun>(
        SingleCopyRun{k, push, exposed, remote_offset, local_in, local_out, runs,
                      reinterpret_cast<std::uintptr_t>(exposed), std::vector<std::uintptr_t>(g), 1,
                      0, std::vector<int>(g, 1)});
    r.keep_ = sc;
    unsigned& started = state_->single_copies[static_cast<std::size_t>(k)];
    const int tag = 1 + static_cast<int>(started++ % single_copy_tags);
    must(MPI_Iallgather(&sc->mine, sizeof sc->mine, MPI_BYTE, sc->where.data(), sizeof sc->mine,
                        MPI_BYTE, group(k), &r.requests_.emplace_back()),
         r.call_);
    r.then_ = [this, sc, tag](Request& addressed) {
      single_copy_rows(*sc);
      const MeshGroup grp = mesh_.group(rank_, sc->k);
      addressed.call_ = "MPI_Isend";
      for (int j = 0; j < grp.size; ++j) {
        if (j == grp.index) continue;
        must(MPI_Irecv(&sc->words[static_cast<std::size_t>(j)], 1, MPI_INT, grp.rank(j), tag,
                       state_->control, &addressed.requests_.emplace_back()),
             "MPI_Irecv");
        must(MPI_Isend(&sc->ok, 1, MPI_INT, grp.rank(j), tag, state_->control,
                       &addressed.requests_.emplace_back()),
             addressed.call_);
      }
      addressed.then_ = [sc](Request&) {
        if (sc->ok != 0 && std::ranges::all_of(sc->words, [](int w) { return w != 0; })) return;
        throw error(std::string("MpiBackend: a single-copy all-to-all failed on mesh dim ") +
                    std::to_string(sc->k) +
                    (sc->failure != 0 ? std::string(sc->push ? ": process_vm_writev: "
                                                             : ": process_vm_readv: ") +
                                            std::system_category().message(sc->failure)
                                      : std::string(" on another rank of its group")));
      };
    };
#else
    static_cast<void>(k), static_cast<void>(push), static_cast<void>(exposed),
        static_cast<void>(remote_offset), static_cast<void>(local_in), static_cast<void>(local_out),
        static_cast<void>(runs);
    throw error("MpiBackend: single copy needs Linux");
#endif
    return r;
  }

#ifdef __linux__
  // This rank's copies of single copy `sc`, whose members' addresses are in: band of rows by
  // band, for each member j (next one first) piece j of this rank's strided side (`runs`:
  // `local_in` when pushing, `local_out` when pulling) moved to or from the contiguous bytes at
  // member j's `exposed` + `remote_offset`: written there when `push` (a strided send side), read
  // from there otherwise (a strided receive side). Rows of
  // Options::single_copy_direct_write_from_bytes (pushing) or single_copy_direct_read_from_bytes
  // (pulling) and up go straight, one iovec each; shorter ones 64 KiB at a time, packed into or
  // unpacked from a staging buffer that stays in cache. This rank's own piece is a local copy
  // (into `local_out`, which is `exposed` when pushing). A failure is left in `sc` (no more
  // copies are tried after it). From Options::single_copy_threads_from_bytes the bands are
  // split between State::copy_threads threads, each a run of bands of its own.
  void single_copy_rows(SingleCopyRun& sc) {
    const StridedPieces runs = sc.runs;
    const auto g = static_cast<std::size_t>(mesh_.size(sc.k));
    const std::size_t band = std::max<std::size_t>(
        1, options_.single_copy_band_bytes / std::max<std::size_t>(1, runs.stride_bytes));
    const std::size_t bands = runs.piece_bytes() == 0 ? 0 : (runs.rows + band - 1) / band;
    const std::size_t threads = runs.piece_bytes() * g >= options_.single_copy_threads_from_bytes
                                    ? std::min<std::size_t>(bands, state_->copy_threads)
                                    : 1;
    if (threads <= 1) {
      single_copy_bands(sc, 0, runs.rows, band, sc.ok, sc.failure);
      return;
    }
    // Thread t copies bands [t * bands / threads, (t + 1) * bands / threads); where a thread
    // cannot be started, this one copies its bands after its own.
    const auto rows_of = [&](std::size_t t) {
      return std::min(runs.rows, t * bands / threads * band);
    };
    std::vector<int> oks(threads, 1), failures(threads, 0);
    std::vector<std::size_t> left;
    {
      std::vector<std::jthread> workers;
      workers.reserve(threads - 1);
      for (std::size_t t = 1; t < threads; ++t) {
        try {
          workers.emplace_back(
              [this, &sc, &oks, &failures, t, band, first = rows_of(t), last = rows_of(t + 1)] {
                try {
                  single_copy_bands(sc, first, last, band, oks[t], failures[t]);
                } catch (const std::bad_alloc&) {  // its rows' iovecs or staging
                  oks[t] = 0;
                  failures[t] = ENOMEM;
                }
              });
        } catch (const std::system_error&) {
          left.push_back(t);
        }
      }
      single_copy_bands(sc, 0, rows_of(1), band, oks[0], failures[0]);
      for (const std::size_t t : left)
        single_copy_bands(sc, rows_of(t), rows_of(t + 1), band, oks[t], failures[t]);
    }  // joined
    for (std::size_t t = 0; t < threads; ++t)
      if (oks[t] == 0) {
        sc.ok = 0;
        sc.failure = failures[t];
        return;
      }
  }

  // single_copy_rows' copies of rows [first_row, last_row) (whole bands of `band` rows, the last
  // one cut at last_row), every member's piece of a band before the next; a failure is left in
  // `ok` and `failure`.
  void single_copy_bands(const SingleCopyRun& sc, std::size_t first_row, std::size_t last_row,
                         std::size_t band, int& ok, int& failure) const {
    const int k = sc.k;
    const bool push = sc.push;
    const void* const exposed = sc.exposed;
    const std::size_t remote_offset = sc.remote_offset;
    const void* const local_in = sc.local_in;
    void* const local_out = sc.local_out;
    const StridedPieces runs = sc.runs;
    const MeshGroup grp = mesh_.group(rank_, k);
    const auto g = static_cast<std::size_t>(grp.size);
    const auto me = static_cast<std::size_t>(grp.index);
    const std::size_t run = runs.run_bytes;
    const bool direct = run >= (push ? options_.single_copy_direct_write_from_bytes
                                     : options_.single_copy_direct_read_from_bytes);
    const std::size_t rows_per = direct
                                     ? max_iovecs
                                     : std::max<std::size_t>(1, options_.single_copy_chunk_bytes /
                                                                    std::max<std::size_t>(1, run));
    std::vector<std::byte> staging(direct ? 0 : std::min(rows_per, runs.rows) * run);
    std::vector<iovec> rows(direct ? std::min(rows_per, runs.rows) : 0);
    const std::vector<int>& pids = state_->pids[static_cast<std::size_t>(k)];
    const std::vector<std::uintptr_t>& where = sc.where;
    // Rows [row, row + m) of member j's piece: a local copy for this rank's own, else one
    // kernel call (straight, or through the staging buffer).
    const auto move_rows = [&](std::size_t j, std::size_t row, std::size_t m) {
      // (Pulling, there is no strided source: no offset from a null local_in.)
      const std::byte* in = push ? static_cast<const std::byte*>(local_in) + j * run : nullptr;
      std::byte* out = static_cast<std::byte*>(local_out) + j * run;
      const std::size_t at = remote_offset + row * run;
      const std::size_t bytes = m * run;
      if (j == me) {
        if (push) {
          auto* to = static_cast<std::byte*>(local_out) + at;
          for (std::size_t i = 0; i < m; ++i)
            std::memcpy(to + i * run, in + (row + i) * runs.stride_bytes, run);
        } else {
          const auto* from = static_cast<const std::byte*>(exposed) + at;
          for (std::size_t i = 0; i < m; ++i)
            std::memcpy(out + (row + i) * runs.stride_bytes, from + i * run, run);
        }
        return;
      }
      if (ok == 0) return;
      // NOLINTNEXTLINE(performance-no-int-to-ptr): member j's address, reached by the kernel
      iovec there{reinterpret_cast<void*>(where[j] + at), bytes};
      if (direct) {  // this rank's rows where they lie, one iovec each
        for (std::size_t i = 0; i < m; ++i) {
          const std::size_t offset = (row + i) * runs.stride_bytes;
          rows[i] = {push ? const_cast<std::byte*>(in + offset)  // NOLINT: only read
                          : out + offset,
                     run};
        }
        const ssize_t moved = push ? process_vm_writev(pids[j], rows.data(), m, &there, 1, 0)
                                   : process_vm_readv(pids[j], rows.data(), m, &there, 1, 0);
        if (moved != static_cast<ssize_t>(bytes)) {
          ok = 0;
          failure = moved < 0 ? errno : EIO;  // EIO: a short copy
        }
        return;
      }
      iovec here{staging.data(), bytes};
      if (push) {
        for (std::size_t i = 0; i < m; ++i)
          std::memcpy(staging.data() + i * run, in + (row + i) * runs.stride_bytes, run);
        if (process_vm_writev(pids[j], &here, 1, &there, 1, 0) != static_cast<ssize_t>(bytes)) {
          ok = 0;
          failure = errno;
        }
        return;
      }
      if (process_vm_readv(pids[j], &here, 1, &there, 1, 0) != static_cast<ssize_t>(bytes)) {
        ok = 0;
        failure = errno;
        return;
      }
      for (std::size_t i = 0; i < m; ++i)
        std::memcpy(out + (row + i) * runs.stride_bytes, staging.data() + i * run, run);
    };
    // Bands of rows whose strided side spans about Options::single_copy_band_bytes: every
    // member's piece of a band moves before the next band, so the band stays in cache.
    for (std::size_t first = first_row; first < last_row && runs.piece_bytes() != 0;
         first += band) {
      const std::size_t last = std::min(last_row, first + band);
      for (std::size_t step = 0; step < g; ++step)
        for (std::size_t row = first; row < last; row += rows_per)
          move_rows((me + step) % g, row, std::min(rows_per, last - row));
    }
  }
#endif

  // The most iovecs one process_vm_readv or process_vm_writev takes (Linux's UIO_MAXIOV).
  static constexpr std::size_t max_iovecs = 1024;

  // One tensor's piece in a batched collective: its first byte and its runs (no piece where
  // `at` is null or the runs hold no bytes).
  struct BatchedPiece {
    const void* at = nullptr;
    StridedPieces runs;
  };
  // One MPI_Ialltoallw over the pieces of `parts` tensors where they lie (nothing packed):
  // member j's datatype on each side picks piece_of(receive, j, t) of every tensor t, at its
  // absolute address (MPI_BOTTOM), one run as bytes and strided runs as an hvector datatype
  // built once per tensor and side (from its first member's runs, the same for all members).
  template <class PieceOf>
  Request start_batched(int mesh_dim, std::size_t parts, PieceOf piece_of) {
    Request r = begin("MPI_Ialltoallw");
    const MPI_Comm comm = group(mesh_dim);
    const auto g = static_cast<std::size_t>(mesh_.size(mesh_dim));
    std::vector<MPI_Datatype> runs_types(2 * parts, MPI_DATATYPE_NULL);
    r.counts_.assign(2 * g, 0);
    r.type_args_.assign(2 * g, MPI_BYTE);
    std::vector<int> lengths;
    std::vector<MPI_Aint> at;
    std::vector<MPI_Datatype> types;
    for (std::size_t side = 0; side < 2; ++side)
      for (std::size_t j = 0; j < g; ++j) {
        lengths.clear();
        at.clear();
        types.clear();
        for (std::size_t t = 0; t < parts; ++t) {
          const BatchedPiece p = piece_of(side == 1, j, t);
          if (p.at == nullptr || p.runs.piece_bytes() == 0) continue;
          MPI_Aint address = 0;
          must(MPI_Get_address(p.at, &address), "MPI_Get_address");
          const bool one_run = !needs_type(p.runs);
          MPI_Datatype& runs = runs_types[side * parts + t];
          if (!one_run && runs == MPI_DATATYPE_NULL) {
            detail::MpiType& type = r.part_types_.emplace_back();
            runs_type(p.runs, type, r.call_);
            runs = type.get();
          }
          lengths.push_back(one_run ? count_of(p.runs.piece_bytes(), r.call_) : 1);
          at.push_back(address);
          types.push_back(one_run ? MPI_BYTE : runs);
        }
        if (lengths.empty()) continue;
        detail::MpiType& type = r.part_types_.emplace_back();
        must(MPI_Type_create_struct(static_cast<int>(lengths.size()), lengths.data(), at.data(),
                                    types.data(), type.out()),
             "MPI_Type_create_struct");
        must(MPI_Type_commit(type.handle()), "MPI_Type_commit");
        r.counts_[side * g + j] = 1;
        r.type_args_[side * g + j] = type.get();
      }
    // Displacements are 0: the datatypes hold absolute addresses.
    r.counts_.resize(4 * g, 0);
    const int* counts = r.counts_.data();
    const int* zeros = r.counts_.data() + 2 * g;
    must(MPI_Ialltoallw(MPI_BOTTOM, counts, zeros, r.type_args_.data(), MPI_BOTTOM, counts + g,
                        zeros, r.type_args_.data() + g, comm, &r.requests_.emplace_back()),
         r.call_);
    return r;
  }
  static bool needs_type(StridedPieces pieces) noexcept {
    return pieces.rows > 1 && pieces.run_bytes != 0;
  }
  // Makes `type` the datatype of one piece's runs (needs_type): `rows` runs of `run_bytes` bytes
  // `stride_bytes` apart (MPI_Type_create_hvector), not committed; refused (naming `call`)
  // where MPI's counts and displacements cannot hold it.
  void runs_type(StridedPieces pieces, detail::MpiType& type, const char* call) {
    const int rows = count_of(pieces.rows, call), run = count_of(pieces.run_bytes, call);
    if (pieces.rows > static_cast<std::size_t>(INT_MAX) / pieces.run_bytes ||
        pieces.stride_bytes > static_cast<std::size_t>(std::numeric_limits<MPI_Aint>::max()))
      throw error(std::string(call) + ": pieces of " + std::to_string(pieces.rows) + " runs of " +
                  std::to_string(pieces.run_bytes) + " bytes, " +
                  std::to_string(pieces.stride_bytes) + " apart, exceed MPI's counts");
    must(MPI_Type_create_hvector(rows, run, static_cast<MPI_Aint>(pieces.stride_bytes), MPI_BYTE,
                                 type.out()),
         "MPI_Type_create_hvector");
  }
  // Makes `type`, r's datatype for StridedPieces: the runs of one piece (runs_type), resized to
  // an extent of `run_bytes` so that member j's piece starts at j * run_bytes; returns the bytes
  // of one piece as MPI counts them.
  int pieces_type(StridedPieces pieces, detail::MpiType& type, const Request& r) {
    detail::MpiType vector;
    runs_type(pieces, vector, r.call_);
    const int run = count_of(pieces.run_bytes, r.call_);
    must(MPI_Type_create_resized(vector.get(), 0, run, type.out()), "MPI_Type_create_resized");
    must(MPI_Type_commit(type.handle()), "MPI_Type_commit");
    return static_cast<int>(pieces.rows) * run;
  }

  void finish(Request& r) {
    r.requests_.clear();
    r.pieces_type_.reset();
    r.recv_type_.reset();
    r.part_types_.clear();
    r.counts_.clear();
    r.type_args_.clear();
    r.wide_in_ = {};
    // The next stage, if any: one that starts no requests is followed at once by its own next.
    while (r.then_ && r.requests_.empty()) std::exchange(r.then_, nullptr)(r);
    r.wide_out_ = {};
    if (r.requests_.empty()) r.keep_.reset();
  }

  // Starts a reduce-scatter (each member gets its `count` elements of `count` * g) or an
  // all-reduce into `r`.
  void reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
              int mesh_dim, bool scatter, Request& r) {
    const MPI_Comm comm = group(mesh_dim);
    const int g = mesh_.size(mesh_dim);
    const std::size_t total = scatter ? count * static_cast<std::size_t>(g) : count;
    detail::visit_dtype(dtype, [&]<class T>() {
      using C = detail::compute_t<T>;  // float for f16 and bf16: reduce in float
      const C* in = static_cast<const C*>(send);
      C* out = static_cast<C*>(recv);
      if constexpr (!std::is_same_v<C, T>) {
        r.wide_in_ = HostOps::Buffer(total * sizeof(C), false, &state_->aborted);
        r.wide_out_ = HostOps::Buffer(count * sizeof(C), false, &state_->aborted);
        C* wide = reinterpret_cast<C*>(r.wide_in_.data());
        for (std::size_t i = 0; i < total; ++i)
          wide[i] = detail::widen(static_cast<const T*>(send)[i]);
        in = wide;
        out = reinterpret_cast<C*>(r.wide_out_.data());
      }
      const MPI_Op mpi_op = op_for<C>(op);
      const int n = count_of(count, r.call_);
      if (scatter)
        must(MPI_Ireduce_scatter_block(in, out, n, mpi_type<C>(), mpi_op, comm,
                                       &r.requests_.emplace_back()),
             r.call_);
      else
        must(MPI_Iallreduce(static_cast<const void*>(in) == out ? MPI_IN_PLACE : in, out, n,
                            mpi_type<C>(), mpi_op, comm, &r.requests_.emplace_back()),
             r.call_);
      // Once complete: the average, and the narrowing back to f16 or bf16.
      if (op == ReduceOp::avg || !std::is_same_v<C, T>)
        r.then_ = [out, recv, count, g, op](Request&) {
          static_cast<void>(recv);  // written only when narrowing (C is not T)
          if (op == ReduceOp::avg)
            for (std::size_t i = 0; i < count; ++i)
              out[i] = static_cast<C>(out[i] / static_cast<C>(g));
          if constexpr (!std::is_same_v<C, T>)
            for (std::size_t i = 0; i < count; ++i)
              static_cast<T*>(recv)[i] = detail::narrow<T>(out[i]);
        };
    });
  }

  DeviceMesh mesh_;
  Options options_;
  int rank_ = 0;
  std::unique_ptr<State> state_;
};

}  // namespace dtensor
