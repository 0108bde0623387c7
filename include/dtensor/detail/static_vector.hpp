#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <type_traits>

#include "../errors.hpp"
#include "why.hpp"

namespace dtensor::detail {

// One element's storage in a static_vector: constructing or copying a slot touches nothing;
// the vector constructs the element in it.
template <class T>
union vector_slot {
  // NOLINTNEXTLINE(modernize-use-equals-default): `= default` is deleted when T's is not trivial
  constexpr vector_slot() noexcept {}
  constexpr vector_slot(const vector_slot& /*unused*/) noexcept {}
  constexpr vector_slot(vector_slot&& /*unused*/) noexcept {}
  constexpr vector_slot& operator=(const vector_slot& /*unused*/) noexcept { return *this; }
  constexpr vector_slot& operator=(vector_slot&& /*unused*/) noexcept { return *this; }
  constexpr ~vector_slot() = default;
  T value;
};

// A random-access iterator over the elements of a static_vector (V: T or const T).
template <class V, class Slot>
class slot_iterator {
 public:
  using iterator_category = std::random_access_iterator_tag;
  using iterator_concept = std::random_access_iterator_tag;
  using value_type = std::remove_const_t<V>;
  using difference_type = std::ptrdiff_t;
  using pointer = V*;
  using reference = V&;

  constexpr slot_iterator() noexcept = default;
  constexpr explicit slot_iterator(Slot* at) noexcept : at_(at) {}
  // The const iterator from the mutable one.
  template <class W, class S>
  requires(!std::is_same_v<S, Slot> && std::is_convertible_v<S*, Slot*>) constexpr slot_iterator(
      const slot_iterator<W, S>& other) noexcept
      : at_(other.at_) {}

  constexpr V& operator*() const noexcept { return at_->value; }
  constexpr V* operator->() const noexcept { return &at_->value; }
  constexpr V& operator[](difference_type i) const noexcept { return at_[i].value; }
  constexpr slot_iterator& operator++() noexcept { return ++at_, *this; }
  constexpr slot_iterator operator++(int) noexcept { return slot_iterator(at_++); }
  constexpr slot_iterator& operator--() noexcept { return --at_, *this; }
  constexpr slot_iterator operator--(int) noexcept { return slot_iterator(at_--); }
  constexpr slot_iterator& operator+=(difference_type n) noexcept { return at_ += n, *this; }
  constexpr slot_iterator& operator-=(difference_type n) noexcept { return at_ -= n, *this; }
  friend constexpr slot_iterator operator+(slot_iterator it, difference_type n) noexcept {
    return it += n;
  }
  friend constexpr slot_iterator operator+(difference_type n, slot_iterator it) noexcept {
    return it += n;
  }
  friend constexpr slot_iterator operator-(slot_iterator it, difference_type n) noexcept {
    return it -= n;
  }
  friend constexpr difference_type operator-(slot_iterator a, slot_iterator b) noexcept {
    return a.at_ - b.at_;
  }
  friend constexpr bool operator==(slot_iterator a, slot_iterator b) noexcept {
    return a.at_ == b.at_;
  }
  friend constexpr auto operator<=>(slot_iterator a, slot_iterator b) noexcept {
    return a.at_ <=> b.at_;
  }

 private:
  template <class W, class S>
  friend class slot_iterator;
  Slot* at_ = nullptr;
};

// A vector with inline storage of fixed capacity: constexpr, never allocates. At run time only
// the live elements are ever constructed or copied (planning copies these often, and most of
// their capacity is unused); in constant evaluation every slot holds an element, as a
// constexpr variable needs.
template <class T, std::size_t N>
class static_vector {
  static_assert(std::is_trivially_destructible_v<T>, "static_vector never destroys elements");
  using slot = vector_slot<T>;

 public:
  using value_type = T;
  using size_type = std::size_t;
  using iterator = slot_iterator<T, slot>;
  using const_iterator = slot_iterator<const T, const slot>;

  constexpr static_vector() noexcept {
    if (std::is_constant_evaluated() || whole_copy)
      for (slot& s : data_) std::construct_at(&s.value);
  }
  constexpr static_vector(const static_vector& other) noexcept : size_(other.size_) {
    copy_from(other);
  }
  constexpr static_vector& operator=(const static_vector& other) noexcept {
    if (this != &other) {
      size_ = other.size_;
      copy_from(other);
    }
    return *this;
  }
  // Elements are copied either way: moving saves nothing.
  constexpr static_vector(static_vector&& other) noexcept : size_(other.size_) { copy_from(other); }
  constexpr static_vector& operator=(static_vector&& other) noexcept {
    if (this != &other) {
      size_ = other.size_;
      copy_from(other);
    }
    return *this;
  }
  constexpr ~static_vector() = default;
  constexpr static_vector(std::initializer_list<T> values) : static_vector() {
    if (values.size() > N) fail<why::capacity_exceeded>(N, values.size());
    for (const T& v : values) std::construct_at(&data_[size_++].value, v);
  }
  // `count` copies of `value`.
  constexpr static_vector(std::size_t count, const T& value) : static_vector() {
    if (count > N) fail<why::capacity_exceeded>(N, count);
    for (std::size_t i = 0; i < count; ++i) std::construct_at(&data_[size_++].value, value);
  }

  [[nodiscard]] static constexpr std::size_t capacity() noexcept { return N; }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] constexpr bool full() const noexcept { return size_ == N; }

  constexpr T& operator[](std::size_t i) noexcept { return data_[i].value; }
  constexpr const T& operator[](std::size_t i) const noexcept { return data_[i].value; }
  // Bounds-checked access.
  [[nodiscard]] constexpr const T& at(std::size_t i) const {
    if (i >= size_) fail<why::index_out_of_range>(i, size_);
    return data_[i].value;
  }
  [[nodiscard]] constexpr T& at(std::size_t i) {
    if (i >= size_) fail<why::index_out_of_range>(i, size_);
    return data_[i].value;
  }
  [[nodiscard]] constexpr T& front() noexcept { return data_[0].value; }
  [[nodiscard]] constexpr const T& front() const noexcept { return data_[0].value; }
  [[nodiscard]] constexpr T& back() noexcept { return data_[size_ - 1].value; }
  [[nodiscard]] constexpr const T& back() const noexcept { return data_[size_ - 1].value; }

  [[nodiscard]] constexpr iterator begin() noexcept { return iterator(data_.data()); }
  [[nodiscard]] constexpr iterator end() noexcept { return iterator(data_.data() + size_); }
  [[nodiscard]] constexpr const_iterator begin() const noexcept {
    return const_iterator(data_.data());
  }
  [[nodiscard]] constexpr const_iterator end() const noexcept {
    return const_iterator(data_.data() + size_);
  }

  constexpr void push_back(const T& v) {
    if (size_ == N) fail<why::capacity_exceeded>(N, N + 1);
    std::construct_at(&data_[size_++].value, v);
  }
  constexpr void pop_back() noexcept { --size_; }
  constexpr void clear() noexcept { size_ = 0; }
  constexpr void resize(std::size_t n, const T& fill = T{}) {
    if (n > N) fail<why::capacity_exceeded>(N, n);
    for (std::size_t i = size_; i < n; ++i) std::construct_at(&data_[i].value, fill);
    size_ = n;
  }

  friend constexpr bool operator==(const static_vector& a, const static_vector& b) {
    if (a.size_ != b.size_) return false;
    for (std::size_t i = 0; i < a.size_; ++i)
      if (!(a.data_[i].value == b.data_[i].value)) return false;
    return true;
  }

 private:
  // Copies other's live elements (every slot in constant evaluation, or when whole_copy);
  // size_ is set.
  constexpr void copy_from(const static_vector& other) noexcept {
    if constexpr (whole_copy) {
      if (!std::is_constant_evaluated()) {
        std::memcpy(static_cast<void*>(data_.data()), static_cast<const void*>(other.data_.data()),
                    sizeof(data_));
        return;
      }
    }
    // Not `const auto n = is_constant_evaluated() ? N : size_`: a const integer's initializer is
    // tried as a constant expression first, where is_constant_evaluated() is true.
    std::size_t n = size_;
    if (std::is_constant_evaluated()) n = N;
    for (std::size_t i = 0; i < n; ++i) std::construct_at(&data_[i].value, other.data_[i].value);
  }

  // Small storage of trivially copyable elements (shapes, coordinates, placements) is always
  // initialized and copied whole: a fixed-size copy beats a loop. Only large storage (plans'
  // steps, batches' plans) leaves its unused slots untouched.
  static constexpr bool whole_copy =
      std::is_trivially_copyable_v<T> && sizeof(vector_slot<T>) * N <= 256;

  std::array<slot, N> data_;
  std::size_t size_ = 0;
};

}  // namespace dtensor::detail
