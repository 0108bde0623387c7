#pragma once

#include <array>
#include <cstddef>
#include <mutex>
#include <vector>

#include "../plan.hpp"

// The shifts of a step's point-to-point rounds, remembered for the process. Deciding them
// (shifts_past_bound) weighs every rank's pieces, O(ranks x peers) on each rank: 2.6 ms for an
// exchange on a 16x64 mesh, paid by every call of a training loop. The answer depends on the
// plan, the step and the link's abilities only, the same on every rank and every run; the
// simulator's ranks, threads of one process, share it too.
namespace dtensor::detail {

// Key: what else decides the shifts (the link's abilities, which kind of round), with ==.
template <class Key>
class RoundShiftsMemo {
 public:
  static constexpr std::size_t capacity = 8;

  // The remembered shifts of step `step` of `plan` under `key`, else `compute()`'s, kept in place
  // of the oldest entry. One lock for both: a rank that waits for another's computation takes
  // its answer.
  template <class Compute>
  std::vector<int> get(const Plan& plan, const Step& step, const Key& key, Compute&& compute) {
    const std::lock_guard lock(mutex_);
    for (const Entry& e : entries_)
      if (e.used && e.key == key && e.step == step && e.plan == plan) return e.shifts;
    std::vector<int> shifts = compute();
    entries_[next_++ % capacity] = {plan, step, key, true, shifts};
    return shifts;
  }

 private:
  struct Entry {
    Plan plan;
    Step step;
    Key key{};
    bool used = false;
    std::vector<int> shifts;
  };

  std::mutex mutex_;
  std::array<Entry, capacity> entries_{};
  std::size_t next_ = 0;
};

// The process's memo for keys of type Key.
template <class Key>
RoundShiftsMemo<Key>& round_shifts_memo() {
  static RoundShiftsMemo<Key> memo;
  return memo;
}

}  // namespace dtensor::detail
