#pragma once

#include <concepts>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dtensor {

// Every error the library reports at run time; the message names the offending value.
class error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {

inline void append_arg(std::string& out, std::string_view s) { out += s; }
inline void append_arg(std::string& out, const char* s) { out += s; }
inline void append_arg(std::string& out, char c) { out += c; }
template <std::integral I>
void append_arg(std::string& out, I v) {
  out += std::to_string(v);
}
// Sizes (a mesh's or a tensor's extents) as the CLI spells them: "2x4".
template <class R>
requires std::integral<typename R::value_type>
void append_arg(std::string& out, const R& extents) {
  bool first = true;
  for (const auto v : extents) {
    if (!first) out += 'x';
    out += std::to_string(v);
    first = false;
  }
  if (first) out += "()";
}

// Fills each "{}" of `text` with the next argument.
template <class... A>
std::string substitute(std::string_view text, const A&... args) {
  std::string out;
  out.reserve(text.size() + 16 * sizeof...(A));
  [[maybe_unused]] auto next = [&](const auto& arg) {
    const auto at = text.find("{}");
    if (at == std::string_view::npos) return;
    out += text.substr(0, at);
    append_arg(out, arg);
    text.remove_prefix(at + 2);
  };
  (next(args), ...);
  out += text;
  return out;
}

// Reports the error `Why` (a tag from detail/why.hpp). Deliberately not constexpr: reaching it
// during constant evaluation is a compile error whose text names `Why`, and at run time it
// throws dtensor::error with Why::text filled with `args`.
template <class Why, class... A>
[[noreturn]] void fail(const A&... args) {
  throw error(substitute(Why::text, args...));
}

}  // namespace detail
}  // namespace dtensor
