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

#include <climits>
#include <cstddef>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../backend.hpp"
#include "../detail/elementwise.hpp"
#include "../device_mesh.hpp"
#include "../errors.hpp"

// The MPI backend: host buffers, one communicator per mesh dim for this rank's group (made
// with MPI_Comm_split), MPI collectives for the group steps and nonblocking point-to-point
// for exchanges. Runs across machines. Errors come back as dtensor::error with the call's
// name and MPI's error string, not aborts.
namespace dtensor {

// One rank of a mesh whose ranks are the ranks of an MPI communicator; satisfies Backend.
class MpiBackend {
 public:
  static constexpr MemorySpace memory = MemorySpace::host;

  // Every process of `world` constructs it (collective), and every one must be in `mesh`:
  // mesh.rank_at(i) are ranks of `world`.
  explicit MpiBackend(const DeviceMesh& mesh, MPI_Comm world = MPI_COMM_WORLD) : mesh_(mesh) {
    // A duplicate, so that setting its error handler leaves the caller's communicator alone.
    check(MPI_Comm_dup(world, &world_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    int size = 0;
    check(MPI_Comm_rank(world_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(world_, &size), "MPI_Comm_size");
    if (size != mesh.size() || !mesh.contains(rank_)) {
      MPI_Comm_free(&world_);
      throw error("MpiBackend: the communicator has " + std::to_string(size) +
                  " ranks, but the mesh has " + std::to_string(mesh.size()) +
                  " and must hold every one of them (rank " + std::to_string(rank_) + ")");
    }
    for (int k = 0; k < mesh.ndim(); ++k) {
      const MeshGroup g = mesh.group(rank_, k);
      MPI_Comm comm = MPI_COMM_NULL;
      check(MPI_Comm_split(world_, g.first, g.index, &comm), "MPI_Comm_split");
      check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      groups_.push_back(comm);
    }
  }

  MpiBackend(const MpiBackend&) = delete;
  MpiBackend& operator=(const MpiBackend&) = delete;
  MpiBackend(MpiBackend&& other) noexcept
      : mesh_(other.mesh_),
        world_(std::exchange(other.world_, MPI_COMM_NULL)),
        rank_(other.rank_),
        groups_(std::move(other.groups_)) {
    std::memcpy(ops_, other.ops_, sizeof(ops_));
    for (auto& row : other.ops_)
      for (MPI_Op& op : row) op = MPI_OP_NULL;
  }
  MpiBackend& operator=(MpiBackend&&) = delete;

  ~MpiBackend() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& row : ops_)
      for (MPI_Op& op : row)
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
    for (MPI_Comm& c : groups_)
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    if (world_ != MPI_COMM_NULL) MPI_Comm_free(&world_);
  }

  // An operation in flight (start_*): its MPI requests, and what remains to do once they are
  // complete (f16 and bf16 results narrowed from float, avg divided).
  class Request {
   public:
    Request() = default;
    Request(Request&&) noexcept = default;
    Request& operator=(Request&&) noexcept = default;

   private:
    friend class MpiBackend;
    std::vector<MPI_Request> requests_;
    std::vector<std::byte> wide_in_, wide_out_;  // the float copies of an f16/bf16 reduction
    std::function<void()> then_;
  };

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] const DeviceMesh& mesh() const noexcept { return mesh_; }

  // The blocking operations (Backend).
  void all_gather(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    const int n = count_of(bytes, "MPI_Allgather");
    check(MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, group(mesh_dim)), "MPI_Allgather");
  }
  void reduce_scatter(int mesh_dim, const void* send, void* recv, std::size_t count, DType dtype,
                      ReduceOp op) {
    reduce(send, recv, count, dtype, op, mesh_dim, true, nullptr);
  }
  void all_reduce(int mesh_dim, const void* send, void* recv, std::size_t count, DType dtype,
                  ReduceOp op) {
    reduce(send, recv, count, dtype, op, mesh_dim, false, nullptr);
  }
  void all_to_all(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    const int n = count_of(bytes, "MPI_Alltoall");
    check(MPI_Alltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, group(mesh_dim)), "MPI_Alltoall");
  }
  void exchange(std::span<const SendMessage> sends, std::span<const RecvMessage> recvs) {
    Request r = start_exchange(sends, recvs);
    wait(r);
  }

  // The same operations started and finished later (AsyncBackend), with MPI's nonblocking
  // collectives: execute_async overlaps them with the caller's work.
  Request start_all_gather(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    Request r;
    const int n = count_of(bytes, "MPI_Iallgather");
    check(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, group(mesh_dim),
                         &r.requests_.emplace_back()),
          "MPI_Iallgather");
    return r;
  }
  Request start_reduce_scatter(int mesh_dim, const void* send, void* recv, std::size_t count,
                               DType dtype, ReduceOp op) {
    Request r;
    reduce(send, recv, count, dtype, op, mesh_dim, true, &r);
    return r;
  }
  Request start_all_reduce(int mesh_dim, const void* send, void* recv, std::size_t count,
                           DType dtype, ReduceOp op) {
    Request r;
    reduce(send, recv, count, dtype, op, mesh_dim, false, &r);
    return r;
  }
  Request start_all_to_all(int mesh_dim, const void* send, void* recv, std::size_t bytes) {
    Request r;
    const int n = count_of(bytes, "MPI_Ialltoall");
    check(MPI_Ialltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, group(mesh_dim),
                        &r.requests_.emplace_back()),
          "MPI_Ialltoall");
    return r;
  }
  Request start_exchange(std::span<const SendMessage> sends, std::span<const RecvMessage> recvs) {
    constexpr int tag = 0x6474;  // "dt"
    Request request;
    std::vector<MPI_Request>& requests = request.requests_;
    requests.reserve(sends.size() + recvs.size());
    for (const RecvMessage& r : recvs) {
      if (r.peer == rank_ || r.bytes == 0) continue;
      check(MPI_Irecv(r.data, count_of(r.bytes, "MPI_Irecv"), MPI_BYTE, r.peer, tag, world_,
                      &requests.emplace_back()),
            "MPI_Irecv");
    }
    for (const SendMessage& s : sends) {
      if (s.peer == rank_ || s.bytes == 0) continue;
      check(MPI_Isend(s.data, count_of(s.bytes, "MPI_Isend"), MPI_BYTE, s.peer, tag, world_,
                      &requests.emplace_back()),
            "MPI_Isend");
    }
    // Messages to itself, in order.
    std::size_t next_self = 0;
    for (const RecvMessage& r : recvs) {
      if (r.peer != rank_ || r.bytes == 0) continue;
      while (next_self < sends.size() &&
             (sends[next_self].peer != rank_ || sends[next_self].bytes == 0))
        ++next_self;
      if (next_self == sends.size() || sends[next_self].bytes != r.bytes)
        throw error("MpiBackend::exchange: a receive from itself has no matching send");
      std::memcpy(r.data, sends[next_self++].data, r.bytes);
    }
    return request;
  }

  // Whether `r` has finished; finishes it if so.
  bool test(Request& r) {
    int flag = 1;
    if (!r.requests_.empty())
      check(MPI_Testall(static_cast<int>(r.requests_.size()), r.requests_.data(), &flag,
                        MPI_STATUSES_IGNORE),
            "MPI_Testall");
    if (flag) finish(r);
    return flag != 0;
  }
  // Waits until `r` has finished.
  void wait(Request& r) {
    if (!r.requests_.empty())
      check(MPI_Waitall(static_cast<int>(r.requests_.size()), r.requests_.data(),
                        MPI_STATUSES_IGNORE),
            "MPI_Waitall");
    finish(r);
  }

  // The executions in flight on this backend (execute_async keeps them in order).
  [[nodiscard]] ExecutionQueue& executions() noexcept { return executions_; }

 private:
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

  MPI_Comm group(int mesh_dim) const {
    if (mesh_dim < 0 || mesh_dim >= mesh_.ndim())
      throw error("mesh dim " + std::to_string(mesh_dim) + " is out of range for a mesh of " +
                  std::to_string(mesh_.ndim()) + " dims");
    return groups_[static_cast<std::size_t>(mesh_dim)];
  }

  // inout[i] = in[i] op inout[i] with dtensor's own arithmetic (saturating integer sums, NaN
  // propagating max and min), so MPI and the simulated backend agree.
  template <class T, ReduceOp Op>
  static void combine_op(void* in, void* inout, int* len, MPI_Datatype*) {
    const T* a = static_cast<const T*>(in);
    T* b = static_cast<T*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = detail::combine(a[i], b[i], Op);
  }

  template <class T>
  MPI_Op op_for(ReduceOp op) {
    MPI_Op& slot = ops_[static_cast<int>(detail::dtype_index<T>())][static_cast<int>(op)];
    if (slot != MPI_OP_NULL) return slot;
    MPI_User_function* f = nullptr;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: f = &combine_op<T, ReduceOp::sum>; break;
      case ReduceOp::max: f = &combine_op<T, ReduceOp::max>; break;
      case ReduceOp::min: f = &combine_op<T, ReduceOp::min>; break;
      case ReduceOp::product: f = &combine_op<T, ReduceOp::product>; break;
    }
    check(MPI_Op_create(f, 1, &slot), "MPI_Op_create");
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

  void finish(Request& r) {
    r.requests_.clear();
    r.wide_in_ = {};
    if (r.then_) std::exchange(r.then_, nullptr)();
    r.wide_out_ = {};
  }

  // Reduce-scatter (each member gets its `count` elements of `count` * g) or all-reduce: blocking
  // when `started` is null, else started into it.
  void reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
              int mesh_dim, bool scatter, Request* started) {
    const MPI_Comm comm = group(mesh_dim);
    const int g = mesh_.size(mesh_dim);
    const std::size_t total = scatter ? count * static_cast<std::size_t>(g) : count;
    Request blocking;
    Request& r = started != nullptr ? *started : blocking;
    detail::visit_dtype(dtype, [&]<class T>() {
      using C = detail::compute_t<T>;  // float for f16 and bf16: reduce in float
      const C* in = static_cast<const C*>(send);
      C* out = static_cast<C*>(recv);
      if constexpr (!std::is_same_v<C, T>) {
        r.wide_in_.resize(total * sizeof(C));
        r.wide_out_.resize(count * sizeof(C));
        C* wide = reinterpret_cast<C*>(r.wide_in_.data());
        for (std::size_t i = 0; i < total; ++i)
          wide[i] = detail::widen(static_cast<const T*>(send)[i]);
        in = wide;
        out = reinterpret_cast<C*>(r.wide_out_.data());
      }
      const MPI_Op mpi_op = op_for<C>(op);
      const char* name = started ? (scatter ? "MPI_Ireduce_scatter_block" : "MPI_Iallreduce")
                                 : (scatter ? "MPI_Reduce_scatter_block" : "MPI_Allreduce");
      const int n = count_of(count, name);
      if (started == nullptr && scatter)
        check(MPI_Reduce_scatter_block(in, out, n, mpi_type<C>(), mpi_op, comm), name);
      else if (started == nullptr)
        check(MPI_Allreduce(in, out, n, mpi_type<C>(), mpi_op, comm), name);
      else if (scatter)
        check(MPI_Ireduce_scatter_block(in, out, n, mpi_type<C>(), mpi_op, comm,
                                        &r.requests_.emplace_back()),
              name);
      else
        check(MPI_Iallreduce(in, out, n, mpi_type<C>(), mpi_op, comm, &r.requests_.emplace_back()),
              name);
      // Once complete: the average, and the narrowing back to f16 or bf16.
      if (op == ReduceOp::avg || !std::is_same_v<C, T>)
        r.then_ = [out, recv, count, g, op] {
          if (op == ReduceOp::avg)
            for (std::size_t i = 0; i < count; ++i)
              out[i] = static_cast<C>(out[i] / static_cast<C>(g));
          if constexpr (!std::is_same_v<C, T>)
            for (std::size_t i = 0; i < count; ++i)
              static_cast<T*>(recv)[i] = detail::narrow<T>(out[i]);
        };
    });
    if (started == nullptr) finish(blocking);
  }

  DeviceMesh mesh_;
  MPI_Comm world_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::vector<MPI_Comm> groups_;
  ExecutionQueue executions_;
  // Reduction ops per element type (by detail::dtype_index) and ReduceOp, made on first use.
  MPI_Op ops_[8][5] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                       {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                       {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                       {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                       {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                       {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                       {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                       {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
};

}  // namespace dtensor
