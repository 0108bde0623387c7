#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

// Host staging blocks kept for reuse. A run's staging is allocated per step and freed after
// it; a large block fresh from the system costs a page fault on the first touch of each of its
// pages, which on repeated runs of the same plan (a training step) can take longer than the
// copies themselves. Freed blocks of at least min_cached_bytes wait here, per thread, for the
// next request they fit.
namespace dtensor::detail {

class HostBlockCache {
 public:
  // Smaller blocks come from the allocator's own free lists: cheap already.
  static constexpr std::size_t min_cached_bytes = std::size_t{64} << 10;
  static constexpr std::size_t max_blocks = 8;

  // A block of at least `bytes`: the smallest cached one that fits without wasting more than
  // its request (at most twice `bytes`), else a new one. Its contents are unspecified.
  std::unique_ptr<std::byte[]> take(std::size_t bytes, std::size_t& capacity) {
    std::size_t best = max_blocks;
    for (std::size_t i = 0; i < max_blocks; ++i) {
      const std::size_t have = blocks_[i].second;
      if (blocks_[i].first && have >= bytes && have / 2 <= bytes &&
          (best == max_blocks || have < blocks_[best].second))
        best = i;
    }
    if (best == max_blocks) {
      capacity = bytes;
      return std::make_unique_for_overwrite<std::byte[]>(bytes);
    }
    capacity = blocks_[best].second;
    blocks_[best].second = 0;
    return std::move(blocks_[best].first);
  }

  // Keeps `block` (of `capacity` bytes) for reuse, in place of the smallest one kept when full.
  void give(std::unique_ptr<std::byte[]> block, std::size_t capacity) noexcept {
    if (!block || capacity < min_cached_bytes) return;
    std::size_t slot = 0;
    for (std::size_t i = 0; i < max_blocks; ++i) {
      if (!blocks_[i].first) {
        slot = i;
        break;
      }
      if (blocks_[i].second < blocks_[slot].second) slot = i;
    }
    if (blocks_[slot].first && blocks_[slot].second >= capacity) return;  // keep the larger
    blocks_[slot] = {std::move(block), capacity};
  }

  // Frees every kept block.
  void clear() noexcept {
    for (auto& b : blocks_) b = {};
  }

  // Bytes kept.
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& b : blocks_) n += b.first ? b.second : 0;
    return n;
  }

 private:
  std::array<std::pair<std::unique_ptr<std::byte[]>, std::size_t>, max_blocks> blocks_{};
};

// This thread's cache.
inline HostBlockCache& host_block_cache() noexcept {
  thread_local HostBlockCache cache;
  return cache;
}

// Memory that an abandoned operation may still write or read (MPI cannot cancel a started
// collective): kept until the process ends, never freed or reused.
inline void keep_until_exit(std::unique_ptr<std::byte[]> bytes) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::unique_ptr<std::byte[]>>();  // NOLINT: never freed
  const std::lock_guard lock(mutex);
  kept->push_back(std::move(bytes));
}

}  // namespace dtensor::detail
