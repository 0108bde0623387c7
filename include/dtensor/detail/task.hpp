#pragma once

#include <coroutine>
#include <exception>
#include <utility>

// A minimal lazily started coroutine: the executor's steps are written as straight-line code
// that `co_await`s its collectives, so one step function serves the synchronous run (nothing
// ever suspends) and the asynchronous one (it suspends while a collective is in flight).
namespace dtensor::detail {

template <class T>
class Task;

// What Task<T> and Task<void> promises share: lazy start, the awaiting coroutine resumed on
// completion (symmetric transfer, no stack growth), exceptions kept for the awaiter.
struct TaskPromiseBase {
  std::coroutine_handle<> continuation = std::noop_coroutine();
  std::exception_ptr error;

  struct FinalAwaiter {
    [[nodiscard]] bool await_ready() const noexcept { return false; }
    template <class P>
    [[nodiscard]] std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) const noexcept {
      return h.promise().continuation;
    }
    void await_resume() const noexcept {}
  };

  [[nodiscard]] std::suspend_always initial_suspend() const noexcept { return {}; }
  [[nodiscard]] FinalAwaiter final_suspend() const noexcept { return {}; }
  void unhandled_exception() noexcept { error = std::current_exception(); }
};

template <class T>
struct TaskPromise : TaskPromiseBase {
  T value{};
  Task<T> get_return_object() noexcept;
  void return_value(T v) noexcept { value = std::move(v); }
  T take() {
    if (error) std::rethrow_exception(error);
    return std::move(value);
  }
};

template <>
struct TaskPromise<void> : TaskPromiseBase {
  Task<void> get_return_object() noexcept;
  void return_void() const noexcept {}
  void take() const {
    if (error) std::rethrow_exception(error);
  }
};

// Owns its coroutine frame. `co_await task` runs it to completion (suspending the awaiter while
// it is suspended) and returns its value or rethrows its exception.
template <class T = void>
class [[nodiscard]] Task {
 public:
  using promise_type = TaskPromise<T>;
  using Handle = std::coroutine_handle<promise_type>;

  Task() = default;
  explicit Task(Handle h) noexcept : h_(h) {}
  Task(Task&& other) noexcept : h_(std::exchange(other.h_, {})) {}
  Task& operator=(Task&& other) noexcept {
    if (this != &other) {
      if (h_) h_.destroy();
      h_ = std::exchange(other.h_, {});
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() {
    if (h_) h_.destroy();
  }

  [[nodiscard]] Handle handle() const noexcept { return h_; }
  [[nodiscard]] bool done() const noexcept { return !h_ || h_.done(); }
  // The result once done(); rethrows what the coroutine threw.
  T result() { return h_.promise().take(); }

  [[nodiscard]] bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiter) noexcept {
    h_.promise().continuation = awaiter;
    return h_;
  }
  T await_resume() { return h_.promise().take(); }

 private:
  Handle h_;
};

template <class T>
Task<T> TaskPromise<T>::get_return_object() noexcept {
  return Task<T>(std::coroutine_handle<TaskPromise<T>>::from_promise(*this));
}
inline Task<void> TaskPromise<void>::get_return_object() noexcept {
  return Task<void>(std::coroutine_handle<TaskPromise<void>>::from_promise(*this));
}

}  // namespace dtensor::detail
