#pragma once

#include <algorithm>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "../backend.hpp"
#include "../errors.hpp"
#include "../plan.hpp"
#include "link.hpp"
#include "reduce_exchange.hpp"
#include "step_runners.hpp"
#include "task.hpp"

// The driver of asynchronous runs. MPI matches collectives on a communicator by the order they
// are started, so every rank must start the same operations in the same order, however and
// whenever it waits. The rule that guarantees it: on one backend, executions start their
// operations in the order the executions were started, all of one execution's before the next
// one's. An operation whose turn has not come is parked, and started as soon as the executions
// before it have started all of theirs. Executions advance (finish an operation, run their local
// work, start the next) only inside the library's calls: test(), wait(), execute(). A rank that
// waits advances every execution of every backend it has, not only the one it waits for: another
// rank may be waiting for an operation that only this rank's progress can start.
namespace dtensor::detail {

template <class B>
void start_parked(ExecutionQueue& queue);

// One execute_async run: the plan (a copy, so the caller's may go; none for a batch, whose
// coroutine holds what it reads), its coroutine, and the operation it waits for. It stays where
// it is made (its queue and coroutine point at it): copies are deleted, moves with them, and the
// implicit destructor is the right one.
template <class B>
// NOLINTNEXTLINE(cppcoreguidelines-special-member-functions): see above
struct Running final : InFlight {
  B& backend;
  const std::optional<Plan> plan;
  // How many operations the run starts (link_operations, batch_link_operations).
  int operations = 0;
  int started = 0;
  PendingOp<B>* pending = nullptr;  // parked or in flight; null while running or when done
  std::coroutine_handle<> step;     // the coroutine to resume when `pending` finishes
  std::int64_t scratch_peak = 0;
  Task<void> task;

  Running(B& b, const Plan& p)
      : backend(b), plan(p), operations(link_operations(p, backend_abilities(b))) {
    started_all = operations == 0;
  }
  // A run without a plan of its own (a batch) that starts `n` operations.
  Running(B& b, int n) : backend(b), operations(n) { started_all = operations == 0; }
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;

  [[nodiscard]] bool done() const noexcept { return task.done(); }

  // Called by the awaiting step: `op` waits for its turn (and gets it at once when it has come).
  void park(PendingOp<B>& op, std::coroutine_handle<> awaiting) {
    pending = &op;
    step = awaiting;
    start_parked<B>(backend.executions());
  }

  // Starts the parked operation; a failure to start is the operation's error.
  void start_pending() {
    try {
      if (started == operations)
        throw error("execute_async: a run started more operations than it counts");
      pending->request = pending->start(backend);
    } catch (...) {
      pending->error = std::current_exception();
      started_all = true;
    }
    pending->started = true;
    if (++started == operations) started_all = true;
  }

  [[nodiscard]] bool in_flight() const noexcept override {
    return pending != nullptr && pending->started;
  }

  bool advance() override {
    if (!in_flight()) return false;
    PendingOp<B>& op = *pending;
    if (!op.error) {
      try {
        if (!backend.test(op.request)) return false;
      } catch (...) {
        op.error = std::current_exception();
      }
    }
    pending = nullptr;
    std::exchange(step, {}).resume();  // `op` lives in the step's frame: not used after this
    if (done()) {
      if (const std::exception_ptr failed = task.handle().promise().error) {
        try {
          std::rethrow_exception(failed);
        } catch (const std::exception& e) {
          abort_after_error(backend, e.what());
        } catch (...) {
          abort_after_error(backend, "unknown error");
        }
      }
      started_all = true;
      backend.executions().remove(this);
      start_parked<B>(backend.executions());
    }
    return true;
  }
};

// Starts, oldest first, the parked operations whose turn has come.
template <class B>
void start_parked(ExecutionQueue& queue) {
  for (InFlight* entry : queue.entries()) {
    if (entry->started_all) continue;
    auto& r = static_cast<Running<B>&>(*entry);
    if (r.pending == nullptr || r.pending->started) return;  // later executions wait for it
    r.start_pending();
    if (!r.started_all) return;
  }
}

// Whether any execution of this thread has an operation in flight.
inline bool any_in_flight() {
  for (const ExecutionQueue* queue : all_queues())
    for (const InFlight* entry : queue->entries())
      if (entry->in_flight()) return true;
  return false;
}

// Whether every execution of this thread has started all its operations: then a blocking
// operation started now comes after all of them on every rank, and no rank can be waiting for
// this one to start something.
inline bool all_started() {
  const std::vector<ExecutionQueue*>& queues = all_queues();
  return std::all_of(queues.begin(), queues.end(),
                     [](const ExecutionQueue* queue) { return queue->all_started(); });
}

// Advances everything in flight until `me` is done.
template <class B>
void drive(Running<B>& me) {
  while (!me.done())
    if (!advance_any() && !any_in_flight())
      throw error("execute_async: internal error: an execution waits with nothing in flight");
}

// Advances whatever can advance without blocking; whether `me` is done.
template <class B>
bool poll(Running<B>& me) {
  while (!me.done() && advance_any()) {
  }
  return me.done();
}

}  // namespace dtensor::detail
