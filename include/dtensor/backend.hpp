#pragma once

#include <concepts>
#include <cstddef>
#include <span>

#include "device_mesh.hpp"
#include "dtype.hpp"
#include "local_ops.hpp"
#include "reduce_op.hpp"

// What a backend provides to run plans: one per rank, SPMD. The executor (execute.hpp) calls
// these on every rank in the same order; a backend is one header that implements them over its
// communication library (backend/simulated.hpp, backend/mpi.hpp, backend/nccl.hpp).
namespace dtensor {

// Where a backend's buffers live.
enum class MemorySpace { host, device };

// One message of a grouped point-to-point round: `bytes` bytes to or from global rank `peer`.
struct SendMessage {
  int peer = 0;
  const void* data = nullptr;
  std::size_t bytes = 0;
};
struct RecvMessage {
  int peer = 0;
  void* data = nullptr;
  std::size_t bytes = 0;
};

// A backend for one rank of `mesh()`. Collectives act on the group of this rank along one
// mesh dim (mesh().group(rank(), mesh_dim)), members in group-index order; every member calls
// with the same sizes. Buffers hold `count` elements of `dtype` (or plain bytes for pure data
// movement), contiguous, in the backend's memory space.
//  - all_gather: recv holds the members' `bytes` each, in order.
//  - reduce_scatter: send holds one block of `count` elements per member, in order; recv gets
//    this member's block reduced over the group (f16 and bf16 accumulate in float).
//  - all_reduce: recv gets the reduction of send over the group; every member gets bit-identical
//    values.
//  - all_to_all: send holds one block of `bytes` per member, in order; recv gets member j's block
//    for this rank at position j.
//  - exchange: a grouped point-to-point round between global ranks; each send is matched by a
//    receive of the same size on its peer. Messages to self are allowed.
// Reductions combine the members' contributions in group-index order.
// A backend whose memory is not host memory also provides `local_ops()`, the LocalOps
// (local_ops.hpp) that execute() uses for its packing, filling and staging on that memory.
template <class B>
concept Backend = requires(B& b, const B& cb, int mesh_dim, const void* send, void* recv,
                           std::size_t n, DType dtype, ReduceOp op,
                           std::span<const SendMessage> sends, std::span<const RecvMessage> recvs) {
  { B::memory } -> std::convertible_to<MemorySpace>;
  { cb.rank() } -> std::convertible_to<int>;
  { cb.mesh() } -> std::convertible_to<const DeviceMesh&>;
  b.all_gather(mesh_dim, send, recv, n);
  b.reduce_scatter(mesh_dim, send, recv, n, dtype, op);
  b.all_reduce(mesh_dim, send, recv, n, dtype, op);
  b.all_to_all(mesh_dim, send, recv, n);
  b.exchange(sends, recvs);
}
&&(B::memory == MemorySpace::host || requires(B & b) {
  { b.local_ops() } -> LocalOps;
});

// The local operations execute() uses with backend `b`: its own where it has them, HostOps
// otherwise (host memory).
template <Backend B>
decltype(auto) local_ops_of(B& b) {
  if constexpr (requires { b.local_ops(); })
    return b.local_ops();
  else
    return HostOps{};
}

}  // namespace dtensor
