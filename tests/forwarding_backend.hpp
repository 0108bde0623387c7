#pragma once

// A test backend that passes the Backend concept's calls on to another backend and has nothing
// else: tests build on it to take a capability away (no strided all-to-all, fewer reductions)
// or to act before each call.
#include <dtensor/backend.hpp>

#include <atomic>
#include <cstddef>
#include <span>

namespace dtensor::testing {

// Forwards rank(), mesh() and the five operations to `inner`, calling `before()` first (a
// no-op by default; a test passes its own as Before).
struct NoHook {
  void operator()() const noexcept {}
};

template <class Inner, class Before = NoHook>
class ForwardingBackend {
 public:
  static constexpr MemorySpace memory = MemorySpace::host;

  explicit ForwardingBackend(Inner& inner, Before before = {}) : inner_(inner), before_(before) {}

  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] const DeviceMesh& mesh() const { return inner_.mesh(); }
  void all_gather(int k, const void* s, void* r, std::size_t n) {
    before_();
    inner_.all_gather(k, s, r, n);
  }
  void reduce_scatter(int k, const void* s, void* r, std::size_t n, DType t, ReduceOp op) {
    before_();
    inner_.reduce_scatter(k, s, r, n, t, op);
  }
  void all_reduce(int k, const void* s, void* r, std::size_t n, DType t, ReduceOp op) {
    before_();
    inner_.all_reduce(k, s, r, n, t, op);
  }
  void all_to_all(int k, const void* s, void* r, std::size_t n) {
    before_();
    inner_.all_to_all(k, s, r, n);
  }
  void exchange(std::span<const SendMessage> s, std::span<const RecvMessage> r) {
    before_();
    inner_.exchange(s, r);
  }

 protected:
  Inner& inner_;
  Before before_;
};

// SimulatedBackend-like `Inner` asking for reduce-scatters and all-reduces of blocks of 256 bytes
// and up (its type's default) or of `from` bytes (this instance's, as MpiBackend's
// Options::reduce_by_messages_from_bytes) as point-to-point rounds reduced by the executor (as
// MpiBackend does from 1 MiB), and counting the reductions it is still given (all ranks
// together).
template <class Inner>
class MessageReducingBackend : public ForwardingBackend<Inner> {
 public:
  static constexpr std::size_t reduce_messages_bytes = 256;
  MessageReducingBackend(Inner& inner, std::size_t from_bytes = reduce_messages_bytes)
      : ForwardingBackend<Inner>(inner), from(from_bytes) {}
  [[nodiscard]] std::size_t reduce_by_messages_from() const { return from; }
  std::size_t from;
  void reduce_scatter(int k, const void* s, void* r, std::size_t n, DType t, ReduceOp op) {
    ++calls;
    ForwardingBackend<Inner>::reduce_scatter(k, s, r, n, t, op);
  }
  void all_reduce(int k, const void* s, void* r, std::size_t n, DType t, ReduceOp op) {
    ++calls;
    ForwardingBackend<Inner>::all_reduce(k, s, r, n, t, op);
  }
  static inline std::atomic<int> calls{0};
};

// MessageReducingBackend that also runs batched all-to-alls and all-gathers over the tensors'
// buffers through `inner` (BatchedAllToAll, BatchedAllGather), as MpiBackend does: a batch's
// reduce-scatter and all-reduce rounds by messages then send every tensor's pieces from where
// they lie instead of packing them.
template <class Inner>
class BatchedMessageReducingBackend : public MessageReducingBackend<Inner> {
 public:
  using MessageReducingBackend<Inner>::MessageReducingBackend;
  void all_to_all_batched(int k, std::span<const AllToAllPart> parts) {
    this->inner_.all_to_all_batched(k, parts);
  }
  void all_gather_batched(int k, std::span<const AllGatherPart> parts) {
    this->inner_.all_gather_batched(k, parts);
  }
};

}  // namespace dtensor::testing
