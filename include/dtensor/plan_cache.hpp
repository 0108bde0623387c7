#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "layout.hpp"
#include "plan.hpp"
#include "planner.hpp"

// Plans remembered by their layouts and options: a training step redistributes the same layouts
// every iteration, and a hit costs a hash and a comparison where planning costs the search.
// (PyTorch DTensor keeps its planner's result per spec pair the same way.)
namespace dtensor {

// The last `Capacity` distinct (source, target, options) a program planned, each with its plan.
// Fixed capacity and no heap: about 3.6 KB per entry, so keep a large cache in static or heap
// storage. Not thread-safe: one per thread, or one behind a lock.
template <std::size_t Capacity = 64>
class PlanCache {
  static_assert(Capacity > 0, "a PlanCache holds at least one plan");

 public:
  // plan_redistribute(src, dst, options): the remembered plan, or a new one, remembered in place
  // of the least recently used when the cache is full. Bad input throws as plan_redistribute
  // does, and nothing is remembered. The reference is valid until the next call that plans.
  const Plan& get(const Layout& src, const Layout& dst, const PlanOptions& options = {}) {
    const std::uint64_t h = key_hash(src, dst, options);
    ++tick_;
    std::size_t slot = 0;
    for (std::size_t i = 0; i < size_; ++i) {
      Entry& e = entries_[i];
      if (e.hash == h && e.options == options && e.plan.src() == src && e.plan.dst() == dst) {
        e.last_used = tick_;
        ++hits_;
        return e.plan;
      }
      if (e.last_used < entries_[slot].last_used) slot = i;
    }
    Plan plan = plan_redistribute(src, dst, options);  // may throw: nothing changes then
    if (size_ < Capacity) slot = size_++;
    Entry& e = entries_[slot];
    e.hash = h;
    e.last_used = tick_;
    e.options = options;
    e.plan = plan;
    ++misses_;
    return e.plan;
  }

  // Plans remembered now.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] static constexpr std::size_t capacity() noexcept { return Capacity; }
  // Calls of get() answered from the cache, and planned.
  [[nodiscard]] std::uint64_t hits() const noexcept { return hits_; }
  [[nodiscard]] std::uint64_t misses() const noexcept { return misses_; }
  // Forgets every plan (the counts stay).
  void clear() noexcept { size_ = 0; }

 private:
  struct Entry {
    std::uint64_t hash = 0;
    std::uint64_t last_used = 0;
    PlanOptions options;
    Plan plan;
  };

  // FNV-1a over what tells two keys apart most often (equal keys, equal hashes; the rest is
  // compared in full on a match).
  static std::uint64_t key_hash(const Layout& src, const Layout& dst, const PlanOptions& o) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](std::uint64_t v) {
      h ^= v;
      h *= 0x100000001b3ull;
    };
    for (const int e : src.mesh().shape()) mix(static_cast<std::uint64_t>(e));
    for (const std::int64_t n : src.global_shape()) mix(static_cast<std::uint64_t>(n));
    for (const Layout* l : {&src, &dst})
      for (const Placement& p : l->placements()) mix(p.hash());
    mix(static_cast<std::uint64_t>(src.dtype()) << 8 | static_cast<std::uint64_t>(src.policy()));
    auto bit = [](bool b) { return b ? std::uint64_t{1} : std::uint64_t{0}; };
    mix(static_cast<std::uint64_t>(o.objective) | static_cast<std::uint64_t>(o.padding) << 8 |
        static_cast<std::uint64_t>(o.memory) << 16 |
        static_cast<std::uint64_t>(o.partial_from_replicate) << 24 | bit(o.allow_exchange) << 32 |
        bit(o.allow_all_to_all) << 33 | bit(o.has_cost_model) << 34 | bit(o.exact_values) << 35);
    return h;
  }

  std::array<Entry, Capacity> entries_{};
  std::size_t size_ = 0;
  std::uint64_t tick_ = 0;
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
};

}  // namespace dtensor
