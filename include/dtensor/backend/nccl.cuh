#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../backend.hpp"
#include "../cuda/check.hpp"
#include "../cuda/device_ops.cuh"
#include "../device_mesh.hpp"
#include "../dtype.hpp"
#include "../errors.hpp"
#include "../reduce_op.hpp"

// Plans on NCCL, on raw device buffers: one communicator per mesh-dim group, split from a world
// communicator; every collective and the local packing enqueued on one CUDA stream, with no
// host synchronisation inside a plan's run. Errors from CUDA and NCCL become dtensor::error
// naming the call; an asynchronous NCCL error aborts the communicators instead of hanging.
//
// Differences from the reference (simulated) backends, which are NCCL's: reductions combine in
// NCCL's order and, for f16 and bf16, at NCCL's precision; integer sums wrap instead of
// saturating. Replicas of an all-reduce are still identical on every rank.
namespace dtensor {

namespace cuda {

// "<call> failed: <NCCL's error string> (<NCCL's last error message>)".
inline std::string nccl_message(ncclResult_t result, const char* call, ncclComm_t comm) {
  std::string message = std::string(call) + " failed: " + ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') message += std::string(" (") + last + ")";
  return message;
}

// Throws dtensor::error(nccl_message(...)) unless `result` is ncclSuccess (or ncclInProgress
// on a non-blocking communicator).
inline void check_nccl(ncclResult_t result, const char* call, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  throw error(nccl_message(result, call, comm));
}

// NCCL's name for a dtype.
inline ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
  }
  throw error("no NCCL type for dtype " + std::to_string(static_cast<int>(t)));
}

// NCCL's name for a reduce op.
inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::product: return ncclProd;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  throw error("no NCCL op for reduce op " + std::to_string(static_cast<int>(op)));
}

}  // namespace cuda

// A fresh NCCL unique id, made on one rank and given to every rank (e.g. by MPI_Bcast).
inline ncclUniqueId nccl_unique_id() {
  ncclUniqueId id;
  cuda::check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return id;
}

// An owned NCCL communicator, destroyed (or aborted, after an error) with its owner.
class NcclComm {
 public:
  NcclComm() = default;
  // Takes ownership of `comm`.
  explicit NcclComm(ncclComm_t comm) noexcept : comm_(comm) {}
  // Rank `rank` of `nranks` joins the communicator of `id`; collective over the ranks.
  NcclComm(const ncclUniqueId& id, int nranks, int rank) {
    if (nranks < 1 || rank < 0 || rank >= nranks)
      throw error("ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                  std::to_string(nranks) + " ranks");
    cuda::check_nccl(ncclCommInitRank(&comm_, nranks, id, rank), "ncclCommInitRank");
  }
  NcclComm(NcclComm&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)) {}
  NcclComm& operator=(NcclComm&& o) noexcept {
    if (this != &o) {
      reset();
      comm_ = std::exchange(o.comm_, nullptr);
    }
    return *this;
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() { reset(); }

  [[nodiscard]] ncclComm_t get() const noexcept { return comm_; }
  // Aborts the communicator: its pending operations are dropped and it is freed.
  void abort() noexcept {
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  void reset() noexcept {
    if (comm_ == nullptr) return;
    ncclResult_t pending = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &pending) != ncclSuccess || pending != ncclSuccess)
      (void)ncclCommAbort(comm_);
    else
      (void)ncclCommDestroy(comm_);
    comm_ = nullptr;
  }
  ncclComm_t comm_ = nullptr;
};

// One rank of a mesh on NCCL; satisfies Backend. Rank i of the world communicator plays the
// mesh's i-th rank in row-major order (mesh.rank_at(i)).
class NcclBackend {
 public:
  static constexpr MemorySpace memory = MemorySpace::device;

  struct Options {
    // How long synchronize() waits for the stream before it aborts the communicators.
    std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  };

  // Splits `world` (mesh.size() ranks, not owned) into one communicator per mesh-dim group
  // with ncclCommSplit: collective over the world, every rank constructs its backend together.
  NcclBackend(ncclComm_t world, const DeviceMesh& mesh, cudaStream_t stream)
      : NcclBackend(world, mesh, stream, Options{}) {}
  NcclBackend(ncclComm_t world, const DeviceMesh& mesh, cudaStream_t stream, Options options)
      : world_(world), mesh_(mesh), stream_(stream), options_(options) {
    int count = 0, index = 0;
    cuda::check_nccl(ncclCommCount(world, &count), "ncclCommCount", world);
    cuda::check_nccl(ncclCommUserRank(world, &index), "ncclCommUserRank", world);
    if (count != mesh.size())
      throw error("NcclBackend: the world communicator has " + std::to_string(count) +
                  " ranks, the mesh " + std::to_string(mesh.size()));
    rank_ = mesh.rank_at(index);
    for (int k = 0; k < mesh.ndim(); ++k) {
      const MeshGroup g = mesh.group(rank_, k);
      ncclComm_t sub = nullptr;
      cuda::check_nccl(ncclCommSplit(world, g.first, g.index, &sub, nullptr), "ncclCommSplit",
                       world);
      groups_.emplace_back(sub);
    }
  }

  // Which reductions NCCL has (avg and bf16 arrived in NCCL 2.10); execute() checks a plan's.
  [[nodiscard]] static constexpr bool supports(DType dtype, ReduceOp op) noexcept {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    (void)dtype;
    (void)op;
    return true;
#else
    return op != ReduceOp::avg && dtype != DType::bf16;
#endif
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] const DeviceMesh& mesh() const noexcept { return mesh_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] cuda::DeviceOps local_ops() const noexcept { return cuda::DeviceOps(stream_); }
  // The communicator of this rank's group along mesh dim k.
  [[nodiscard]] ncclComm_t group_comm(int k) const {
    return groups_.at(static_cast<std::size_t>(k)).get();
  }

  // A collective of no element launches nothing: every member of the group passes the same
  // count, so all of them skip it (the planner costs it nothing).
  void all_gather(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    if (bytes == 0) return;
    ncclComm_t c = group_comm(mesh_dim);
    call(ncclAllGather(send, recv, bytes, ncclUint8, c, stream_), "ncclAllGather", c);
  }
  void reduce_scatter(int mesh_dim, const void* send, void* recv, std::size_t count, DType dtype,
                      ReduceOp op) {
    if (count == 0) return;
    ncclComm_t c = group_comm(mesh_dim);
    call(
        ncclReduceScatter(send, recv, count, cuda::nccl_type(dtype), cuda::nccl_op(op), c, stream_),
        "ncclReduceScatter", c);
  }
  void all_reduce(int mesh_dim, const void* send, void* recv, std::size_t count, DType dtype,
                  ReduceOp op) {
    if (count == 0) return;
    ncclComm_t c = group_comm(mesh_dim);
    call(ncclAllReduce(send, recv, count, cuda::nccl_type(dtype), cuda::nccl_op(op), c, stream_),
         "ncclAllReduce", c);
  }
  void all_to_all(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    if (bytes == 0) return;
    ncclComm_t c = group_comm(mesh_dim);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    call(ncclAlltoAll(send, recv, bytes, ncclUint8, c, stream_), "ncclAlltoAll", c);
#else
    const int g = mesh_.size(mesh_dim);
    grouped("ncclAlltoAll (grouped send/recv)", c, [&] {
      for (int j = 0; j < g; ++j) {
        const std::size_t at = static_cast<std::size_t>(j) * bytes;
        cuda::check_nccl(
            ncclSend(static_cast<const std::byte*>(send) + at, bytes, ncclUint8, j, c, stream_),
            "ncclSend", c);
        cuda::check_nccl(
            ncclRecv(static_cast<std::byte*>(recv) + at, bytes, ncclUint8, j, c, stream_),
            "ncclRecv", c);
      }
    });
#endif
  }

  // One grouped round of ncclSend/ncclRecv on the world communicator; messages to self are
  // device copies, matched in order.
  void exchange(std::span<const SendMessage> sends, std::span<const RecvMessage> recvs) {
    std::vector<const SendMessage*> to_self;
    for (const SendMessage& s : sends)
      if (s.peer == rank_ && s.bytes > 0) to_self.push_back(&s);
    std::size_t next_self = 0;
    for (const RecvMessage& r : recvs) {
      if (r.peer != rank_ || r.bytes == 0) continue;
      if (next_self >= to_self.size() || to_self[next_self]->bytes != r.bytes)
        throw error("NcclBackend::exchange: rank " + std::to_string(rank_) + " receives " +
                    std::to_string(r.bytes) + " bytes from itself without a matching send");
      local_ops().copy(r.data, to_self[next_self++]->data, r.bytes);
    }
    grouped("ncclSend/ncclRecv", world_, [&] {
      for (const SendMessage& s : sends)
        if (s.peer != rank_ && s.bytes > 0)
          cuda::check_nccl(
              ncclSend(s.data, s.bytes, ncclUint8, mesh_.index_of(s.peer), world_, stream_),
              "ncclSend", world_);
      for (const RecvMessage& r : recvs)
        if (r.peer != rank_ && r.bytes > 0)
          cuda::check_nccl(
              ncclRecv(r.data, r.bytes, ncclUint8, mesh_.index_of(r.peer), world_, stream_),
              "ncclRecv", world_);
    });
  }

  // Waits until the stream's work is done, polling every communicator for asynchronous errors.
  // On an error, or after Options::timeout, aborts the communicators and throws: a failed peer
  // ends this rank's wait instead of hanging it.
  void synchronize() {
    wait_until([this] { return cudaStreamQuery(stream_); }, "cudaStreamQuery");
  }

  // A point on the stream (StreamBackend): the work enqueued before it. execute_async records
  // one after a plan, and the execution's wait() is this fence's.
  class Fence {
   public:
    explicit Fence(NcclBackend& backend) : backend_(&backend) {
      cuda::check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
                  "cudaEventCreateWithFlags");
      const cudaError_t recorded = cudaEventRecord(event_, backend.stream_);
      if (recorded != cudaSuccess) {
        cudaEventDestroy(event_);
        cuda::check(recorded, "cudaEventRecord");
      }
    }
    Fence(Fence&& other) noexcept
        : backend_(other.backend_), event_(std::exchange(other.event_, nullptr)) {}
    Fence& operator=(Fence&& other) noexcept {
      std::swap(backend_, other.backend_);
      std::swap(event_, other.event_);
      return *this;
    }
    ~Fence() {
      if (event_ != nullptr) cudaEventDestroy(event_);
    }

    // Whether the work before the fence has finished; an NCCL or CUDA error throws (and aborts
    // the communicators).
    bool ready() {
      const cudaError_t status = cudaEventQuery(event_);
      if (status == cudaSuccess) return true;
      if (status != cudaErrorNotReady) {
        backend_->abort();
        cuda::check(status, "cudaEventQuery");
      }
      backend_->poll_all();
      return false;
    }
    // Waits for the work before the fence, as synchronize() waits for the whole stream.
    void wait() {
      backend_->wait_until([this] { return cudaEventQuery(event_); }, "cudaEventQuery");
    }

   private:
    NcclBackend* backend_;
    cudaEvent_t event_ = nullptr;
  };
  [[nodiscard]] Fence record() { return Fence(*this); }

  // Aborts every group communicator (not the world, which the caller owns).
  void abort() noexcept {
    for (NcclComm& c : groups_) c.abort();
  }

 private:
  // Polls `query` (a cudaStreamQuery or cudaEventQuery) until it succeeds, checking the
  // communicators for asynchronous errors; aborts them on an error or after Options::timeout.
  template <class Query>
  void wait_until(Query query, const char* call) {
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    for (;;) {
      const cudaError_t status = query();
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) {
        abort();
        cuda::check(status, call);
      }
      poll_all();
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        throw error("NcclBackend: the stream did not reach the point waited for within " +
                    std::to_string(options_.timeout.count()) +
                    " ms; the communicators were aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Checks an NCCL call's result and its communicator's asynchronous error.
  void call(ncclResult_t result, const char* name, ncclComm_t comm) {
    if (result != ncclSuccess && result != ncclInProgress) {
      const std::string message = cuda::nccl_message(result, name, comm);
      abort();
      throw error(message);
    }
    poll(comm, name);
  }

  template <class F>
  void grouped(const char* name, ncclComm_t comm, F&& issue) {
    cuda::check_nccl(ncclGroupStart(), "ncclGroupStart");
    try {
      issue();
    } catch (...) {
      (void)ncclGroupEnd();
      abort();
      throw;
    }
    call(ncclGroupEnd(), name, comm);
  }

  void poll(ncclComm_t comm, const char* name) {
    ncclResult_t pending = ncclSuccess;
    const ncclResult_t got = ncclCommGetAsyncError(comm, &pending);
    if (got != ncclSuccess || (pending != ncclSuccess && pending != ncclInProgress)) {
      const std::string message =
          cuda::nccl_message(got != ncclSuccess ? got : pending, name, comm) + " (asynchronous)";
      abort();
      throw error(message);
    }
  }
  void poll_all() {
    poll(world_, "NCCL world communicator");
    for (const NcclComm& c : groups_)
      if (c.get() != nullptr) poll(c.get(), "NCCL group communicator");
  }

  ncclComm_t world_;
  DeviceMesh mesh_;
  cudaStream_t stream_;
  Options options_;
  int rank_ = 0;
  std::vector<NcclComm> groups_;
};

static_assert(Backend<NcclBackend> && StreamBackend<NcclBackend>);

}  // namespace dtensor
