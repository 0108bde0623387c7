#pragma once

// Macros, so that the preprocessor sees them (`#if DTENSOR_VERSION >= 100`); the constants
// below are C++'s.
// The library's version, as major * 10000 + minor * 100 + patch.
#define DTENSOR_VERSION 100  // NOLINT(cppcoreguidelines-macro-usage): see above
// The library's version as text.
#define DTENSOR_VERSION_STRING "0.1.0"  // NOLINT(cppcoreguidelines-macro-usage): see above

namespace dtensor {

// The version this header was shipped with.
inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;

}  // namespace dtensor
