#pragma once

#include <concepts>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <limits>
#include <span>

#include "../backend.hpp"
#include "../plan.hpp"

// How the executor's steps reach their backend: `co_await link.all_gather(...)` and so on. A
// synchronous run calls the blocking operation and never suspends; an asynchronous run
// (execute_async) suspends there, and its driver (in_flight.hpp) starts the operation when its
// turn comes and resumes the step once the operation has finished.
namespace dtensor::detail {

template <class B>
struct Running;
template <class B>
struct Link;

// What start_* returns on an asynchronous backend; nothing otherwise.
struct NoRequest {};
template <class B>
struct request_of {
  using type = NoRequest;
};
template <AsyncBackend B>
struct request_of<B> {
  using type = typename B::Request;
};
template <class B>
using RequestOf = typename request_of<B>::type;

// An operation an asynchronous run waits for: parked until its turn, then in flight.
template <class B>
struct PendingOp {
  RequestOf<B> request{};
  std::exception_ptr error;
  bool started = false;

  PendingOp() = default;
  PendingOp(const PendingOp&) = delete;
  PendingOp& operator=(const PendingOp&) = delete;
  virtual RequestOf<B> start(B& backend) = 0;

 protected:
  ~PendingOp() = default;
};

// The awaitable of one operation; `Call` runs it blocking (`run`) or starts it (`start`).
// It is final and PendingOp's destructor is protected: nothing destroys it through a base.
template <class B, class Call>
// NOLINTNEXTLINE(cppcoreguidelines-virtual-class-destructor): final, see above
class Operation final : public PendingOp<B> {
 public:
  Operation(const Link<B>& link, const Call& call) : link_(link), call_(call) {}

  bool await_ready() {
    if (link_.running != nullptr) return false;
    call_.run(link_.backend);
    return true;
  }
  void await_suspend(std::coroutine_handle<> step) {
    if constexpr (AsyncBackend<B>) link_.running->park(*this, step);
  }
  void await_resume() const {
    if (this->error) std::rethrow_exception(this->error);
  }
  RequestOf<B> start(B& backend) override {
    if constexpr (AsyncBackend<B>)
      return call_.start(backend);
    else
      return {};
  }

 private:
  Link<B> link_;
  Call call_;
};

struct AllGatherCall {
  int mesh_dim;
  const void* send;
  void* recv;
  std::size_t bytes;
  template <class B>
  void run(B& b) const {
    b.all_gather(mesh_dim, send, recv, bytes);
  }
  template <class B>
  auto start(B& b) const {
    return b.start_all_gather(mesh_dim, send, recv, bytes);
  }
};

// Reduce-scatter when `scatter`, all-reduce otherwise.
struct ReduceCall {
  bool scatter;
  int mesh_dim;
  const void* send;
  void* recv;
  std::size_t count;
  DType dtype;
  ReduceOp op;
  template <class B>
  void run(B& b) const {
    if (scatter)
      b.reduce_scatter(mesh_dim, send, recv, count, dtype, op);
    else
      b.all_reduce(mesh_dim, send, recv, count, dtype, op);
  }
  template <class B>
  auto start(B& b) const {
    return scatter ? b.start_reduce_scatter(mesh_dim, send, recv, count, dtype, op)
                   : b.start_all_reduce(mesh_dim, send, recv, count, dtype, op);
  }
};

struct AllToAllCall {
  int mesh_dim;
  const void* send;
  void* recv;
  std::size_t bytes;
  template <class B>
  void run(B& b) const {
    b.all_to_all(mesh_dim, send, recv, bytes);
  }
  template <class B>
  auto start(B& b) const {
    return b.start_all_to_all(mesh_dim, send, recv, bytes);
  }
};

// An all-to-all whose pieces are strided (StridedPieces) on either side, on a StridedAllToAll
// backend.
struct AllToAllStridedCall {
  int mesh_dim = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  StridedPieces sent, received;
  template <class B>
  void run(B& b) const {
    b.all_to_all_strided(mesh_dim, send, recv, sent, received);
  }
  template <class B>
  auto start(B& b) const {
    return b.start_all_to_all_strided(mesh_dim, send, recv, sent, received);
  }
};

// An all-gather whose pieces land strided (StridedPieces), on a StridedAllGather backend.
struct AllGatherStridedCall {
  int mesh_dim = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  StridedPieces pieces;
  template <class B>
  void run(B& b) const {
    b.all_gather_strided(mesh_dim, send, recv, pieces);
  }
  template <class B>
  auto start(B& b) const {
    return b.start_all_gather_strided(mesh_dim, send, recv, pieces);
  }
};

// The messages must stay where they are until the exchange finishes (they do: the step that
// awaits it owns them).
struct ExchangeCall {
  std::span<const SendMessage> sends;
  std::span<const RecvMessage> recvs;
  template <class B>
  void run(B& b) const {
    b.exchange(sends, recvs);
  }
  template <class B>
  auto start(B& b) const {
    return b.start_exchange(sends, recvs);
  }
};

// A point-to-point round of strided messages, on a StridedExchange backend.
struct ExchangeStridedCall {
  std::span<const StridedSendMessage> sends;
  std::span<const StridedRecvMessage> recvs;
  template <class B>
  void run(B& b) const {
    b.exchange_strided(sends, recvs);
  }
  template <class B>
  auto start(B& b) const {
    return b.start_exchange_strided(sends, recvs);
  }
};

// One all-to-all over several tensors' buffers, on a BatchedAllToAll backend (a batch's round).
// The parts stay where they are until it finishes (the round that awaits it owns them).
struct AllToAllBatchedCall {
  int mesh_dim = 0;
  std::span<const AllToAllPart> parts;
  template <class B>
  void run(B& b) const {
    b.all_to_all_batched(mesh_dim, parts);
  }
  template <class B>
  auto start(B& b) const {
    return b.start_all_to_all_batched(mesh_dim, parts);
  }
};

// One all-gather over several tensors' buffers, on a BatchedAllGather backend.
struct AllGatherBatchedCall {
  int mesh_dim = 0;
  std::span<const AllGatherPart> parts;
  template <class B>
  void run(B& b) const {
    b.all_gather_batched(mesh_dim, parts);
  }
  template <class B>
  auto start(B& b) const {
    return b.start_all_gather_batched(mesh_dim, parts);
  }
};

// A backend for one run: blocking operations, or those of the asynchronous run `running`. Each
// operation is awaited, `co_await link.all_gather(...)`: one never awaited never runs.
template <class B>
struct Link {
  B& backend;
  Running<B>* running = nullptr;

  [[nodiscard]] auto all_gather(int k, const void* send, void* recv, std::size_t bytes) const {
    return Operation<B, AllGatherCall>(*this, {k, send, recv, bytes});
  }
  [[nodiscard]] auto reduce_scatter(int k, const void* send, void* recv, std::size_t count,
                                    DType dtype, ReduceOp op) const {
    return Operation<B, ReduceCall>(*this, {true, k, send, recv, count, dtype, op});
  }
  [[nodiscard]] auto all_reduce(int k, const void* send, void* recv, std::size_t count, DType dtype,
                                ReduceOp op) const {
    return Operation<B, ReduceCall>(*this, {false, k, send, recv, count, dtype, op});
  }
  [[nodiscard]] auto all_to_all(int k, const void* send, void* recv, std::size_t bytes) const {
    return Operation<B, AllToAllCall>(*this, {k, send, recv, bytes});
  }
  [[nodiscard]] auto exchange(std::span<const SendMessage> sends,
                              std::span<const RecvMessage> recvs) const {
    return Operation<B, ExchangeCall>(*this, {sends, recvs});
  }
  // Only where the backend sends and receives strided pieces itself (StridedAllToAll).
  [[nodiscard]] auto all_to_all_strided(int k, const void* send, void* recv, StridedPieces sent,
                                        StridedPieces received) const requires StridedAllToAll<B> {
    return Operation<B, AllToAllStridedCall>(*this, {k, send, recv, sent, received});
  }
  // Only where the backend sends and receives strided messages itself (StridedExchange).
  [[nodiscard]] auto exchange_strided(std::span<const StridedSendMessage> sends,
                                      std::span<const StridedRecvMessage> recvs) const requires
      StridedExchange<B> {
    return Operation<B, ExchangeStridedCall>(*this, {sends, recvs});
  }
  // Only where the backend receives strided pieces itself (StridedAllGather).
  [[nodiscard]] auto all_gather_strided(int k, const void* send, void* recv,
                                        StridedPieces pieces) const requires StridedAllGather<B> {
    return Operation<B, AllGatherStridedCall>(*this, {k, send, recv, pieces});
  }
  // Only where the backend runs a batch's all-to-all from the tensors' buffers (BatchedAllToAll).
  [[nodiscard]] auto all_to_all_batched(int k, std::span<const AllToAllPart> parts) const requires
      BatchedAllToAll<B> {
    return Operation<B, AllToAllBatchedCall>(*this, {k, parts});
  }
  // Only where the backend runs a batch's all-gather into the tensors' buffers (BatchedAllGather).
  [[nodiscard]] auto all_gather_batched(int k, std::span<const AllGatherPart> parts) const requires
      BatchedAllGather<B> {
    return Operation<B, AllGatherBatchedCall>(*this, {k, parts});
  }
};

// A link whose all-to-all can send and receive strided pieces unpacked (a Link on a
// StridedAllToAll backend; a batch's link packs).
template <class L>
concept StridedLink = requires(const L& link, const void* send, void* recv, StridedPieces p) {
  link.all_to_all_strided(0, send, recv, p, p);
};

// A link whose all-gather can receive strided pieces where they go (a Link on a
// StridedAllGather backend; a batch's link unpacks).
template <class L>
concept StridedGatherLink = requires(const L& link, const void* send, void* recv, StridedPieces p) {
  link.all_gather_strided(0, send, recv, p);
};

// A link whose point-to-point round moves strided messages where they lie (a Link on a
// StridedExchange backend; a batch's link packs).
template <class L>
concept StridedExchangeLink = requires(const L& link, std::span<const StridedSendMessage> s,
                                       std::span<const StridedRecvMessage> r) {
  link.exchange_strided(s, r);
};

// From how many bytes of block a link's even reduce-scatters and all-reduces run as point-to-
// point rounds reduced by dtensor by default: what its backend type declares
// (B::reduce_messages_bytes), else never.
template <class L>
struct reduce_messages_of {
  static constexpr std::size_t bytes = std::numeric_limits<std::size_t>::max();
};
template <class B>
requires requires { B::reduce_messages_bytes; }
struct reduce_messages_of<Link<B>> {
  static constexpr std::size_t bytes = B::reduce_messages_bytes;
};

// The same for one backend: its own threshold where it has one (reduce_by_messages_from(), an
// option of the instance, the same on every rank), else its type's (reduce_messages_of).
template <class B>
std::size_t reduce_messages_from(const B& backend) {
  if constexpr (requires {
                  { backend.reduce_by_messages_from() } -> std::convertible_to<std::size_t>;
                })
    return backend.reduce_by_messages_from();
  else
    return reduce_messages_of<Link<B>>::bytes;
}

// Whether step s of `plan` reduces blocks of at least `from` bytes, judged on the first rank's
// block so that every rank of the mesh decides alike.
inline bool reduces_at_least(const Plan& plan, const Step& s, std::size_t from) {
  if (from == std::numeric_limits<std::size_t>::max()) return false;
  const DeviceMesh& mesh = plan.src().mesh();
  const Box first = plan.src().local_box(s.before, mesh.coordinate(mesh.rank_at(0)));
  return static_cast<std::size_t>(first.numel()) * plan.src().elem_bytes() >= from;
}

}  // namespace dtensor::detail
