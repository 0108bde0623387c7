#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace dtensor::detail {

// A short string with inline storage; the caller checks the length fits.
template <std::size_t N>
class fixed_string {
 public:
  constexpr fixed_string() = default;
  constexpr explicit fixed_string(std::string_view s) noexcept
      : size_(s.size() < N ? s.size() : N) {
    for (std::size_t i = 0; i < size_; ++i) data_[i] = s[i];
  }
  [[nodiscard]] constexpr std::string_view view() const noexcept { return {data_.data(), size_}; }
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }
  friend constexpr bool operator==(const fixed_string& a, const fixed_string& b) noexcept {
    if (a.size_ != b.size_) return false;
    for (std::size_t i = 0; i < a.size_; ++i)
      if (a.data_[i] != b.data_[i]) return false;
    return true;
  }

 private:
  std::array<char, N> data_{};
  std::size_t size_ = 0;
};

}  // namespace dtensor::detail
