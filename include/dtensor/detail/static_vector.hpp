#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>

#include "../errors.hpp"
#include "why.hpp"

namespace dtensor::detail {

// A vector with inline storage of fixed capacity: constexpr, never allocates.
template <class T, std::size_t N>
class static_vector {
 public:
  using value_type = T;
  using size_type = std::size_t;
  using iterator = T*;
  using const_iterator = const T*;

  constexpr static_vector() = default;
  constexpr static_vector(std::initializer_list<T> values) {
    if (values.size() > N) fail<why::capacity_exceeded>(N, values.size());
    for (const T& v : values) data_[size_++] = v;
  }
  // `count` copies of `value`.
  constexpr static_vector(std::size_t count, const T& value) {
    if (count > N) fail<why::capacity_exceeded>(N, count);
    for (std::size_t i = 0; i < count; ++i) data_[size_++] = value;
  }

  [[nodiscard]] static constexpr std::size_t capacity() noexcept { return N; }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] constexpr bool full() const noexcept { return size_ == N; }

  constexpr T& operator[](std::size_t i) noexcept { return data_[i]; }
  constexpr const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  // Bounds-checked access.
  [[nodiscard]] constexpr const T& at(std::size_t i) const {
    if (i >= size_) fail<why::index_out_of_range>(i, size_);
    return data_[i];
  }
  [[nodiscard]] constexpr T& at(std::size_t i) {
    if (i >= size_) fail<why::index_out_of_range>(i, size_);
    return data_[i];
  }
  [[nodiscard]] constexpr T& front() noexcept { return data_[0]; }
  [[nodiscard]] constexpr const T& front() const noexcept { return data_[0]; }
  [[nodiscard]] constexpr T& back() noexcept { return data_[size_ - 1]; }
  [[nodiscard]] constexpr const T& back() const noexcept { return data_[size_ - 1]; }

  [[nodiscard]] constexpr T* data() noexcept { return data_.data(); }
  [[nodiscard]] constexpr const T* data() const noexcept { return data_.data(); }
  [[nodiscard]] constexpr iterator begin() noexcept { return data_.data(); }
  [[nodiscard]] constexpr iterator end() noexcept { return data_.data() + size_; }
  [[nodiscard]] constexpr const_iterator begin() const noexcept { return data_.data(); }
  [[nodiscard]] constexpr const_iterator end() const noexcept { return data_.data() + size_; }

  constexpr void push_back(const T& v) {
    if (size_ == N) fail<why::capacity_exceeded>(N, N + 1);
    data_[size_++] = v;
  }
  constexpr void pop_back() noexcept { --size_; }
  constexpr void clear() noexcept { size_ = 0; }
  constexpr void resize(std::size_t n, const T& fill = T{}) {
    if (n > N) fail<why::capacity_exceeded>(N, n);
    for (std::size_t i = size_; i < n; ++i) data_[i] = fill;
    size_ = n;
  }

  friend constexpr bool operator==(const static_vector& a, const static_vector& b) {
    if (a.size_ != b.size_) return false;
    for (std::size_t i = 0; i < a.size_; ++i)
      if (!(a.data_[i] == b.data_[i])) return false;
    return true;
  }

 private:
  std::array<T, N> data_{};
  std::size_t size_ = 0;
};

}  // namespace dtensor::detail
