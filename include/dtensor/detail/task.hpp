#pragma once

#include <array>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <memory>
#include <new>
#include <utility>

// A minimal lazily started coroutine: the executor's steps are written as straight-line code
// that `co_await`s its collectives, so one step function serves the synchronous run (nothing
// ever suspends) and the asynchronous one (it suspends while a collective is in flight).
namespace dtensor::detail {

template <class T>
class Task;

// Whether coroutine frames are recycled (FramePool): not under AddressSanitizer, which must see
// every frame freed; -DDTENSOR_RECYCLE_FRAMES=0 turns it off elsewhere.
#if defined(DTENSOR_RECYCLE_FRAMES)
inline constexpr bool recycle_frames = DTENSOR_RECYCLE_FRAMES != 0;
#elif defined(__SANITIZE_ADDRESS__)
inline constexpr bool recycle_frames = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool recycle_frames = false;
#else
inline constexpr bool recycle_frames = true;
#endif
#else
inline constexpr bool recycle_frames = true;
#endif

// Coroutine frames recycled per thread: a run allocates a few frames per step (per tensor in a
// batch) and frees them at its end, so the next run takes them back instead of calling the
// heap (a batched run of 64 small tensors spent about a third of its instructions in malloc and
// free). Size classes of 64 bytes up to 8 KiB, at most 64 frames kept per class; larger frames
// go to the heap. The lists are plain thread-local data, emptied by a thread-local reaper when
// the thread ends; a frame freed after that (an execution held by a static object) goes back to
// the heap (recycle_frames).
class FramePool {
 public:
  static void* allocate(std::size_t bytes) {
    if (!recycle_frames || bytes > largest) return ::operator new(bytes);
    Lists& lists = local();
    const std::size_t c = class_of(bytes);
    if (!lists.ended && lists.free[c] != nullptr) {
      Free* f = lists.free[c];
      lists.free[c] = f->next;
      --lists.kept[c];
      return f;
    }
    return ::operator new((c + 1) * granule);
  }
  static void release(void* frame, std::size_t bytes) noexcept {
    if (!recycle_frames || bytes > largest) return ::operator delete(frame);
    Lists& lists = local();
    const std::size_t c = class_of(bytes);
    if (lists.ended || lists.kept[c] == max_kept) return ::operator delete(frame);
    lists.free[c] = std::construct_at(static_cast<Free*>(frame), Free{lists.free[c]});
    ++lists.kept[c];
  }

 private:
  struct Free {
    Free* next;
  };
  static constexpr std::size_t granule = 64;
  static constexpr std::size_t largest = 8192;
  static constexpr std::size_t classes = largest / granule;
  static constexpr int max_kept = 64;
  static constexpr std::size_t class_of(std::size_t bytes) noexcept {
    return bytes == 0 ? 0 : (bytes - 1) / granule;
  }
  // Trivially destructible: usable until the thread's very end.
  struct Lists {
    std::array<Free*, classes> free;
    std::array<int, classes> kept;
    bool ended;
  };
  // Empties the lists when the thread ends.
  struct Reaper {
    Lists* lists;
    explicit Reaper(Lists* l) noexcept : lists(l) {}
    Reaper(const Reaper&) = delete;
    Reaper& operator=(const Reaper&) = delete;
    ~Reaper() {
      for (Free*& head : lists->free)
        while (head != nullptr) ::operator delete(std::exchange(head, head->next));
      lists->ended = true;
    }
  };
  static Lists& local() noexcept {
    thread_local Lists lists{};
    thread_local Reaper reaper{&lists};
    (void)reaper;
    return lists;
  }
};

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

  static void* operator new(std::size_t bytes) { return FramePool::allocate(bytes); }
  static void operator delete(void* frame, std::size_t bytes) noexcept {
    FramePool::release(frame, bytes);
  }
  // (Not used for frames, which are freed with their size: a frame from the pool is memory of
  // the global operator new either way.)
  static void operator delete(void* frame) noexcept { ::operator delete(frame); }

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
