#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "detail/half.hpp"
#include "dtype.hpp"
#include "errors.hpp"
#include "layout.hpp"

// Writing blocks as NumPy .npy files (format 1.0, little-endian, C order), for looking at a
// run's buffers from Python. bf16 has no NumPy type and is widened to float32.
namespace dtensor {

// Writes `data` (`shape`, row-major, elements of `dtype`) to `path` as .npy.
inline void write_npy(const std::string& path, const std::byte* data, const Shape& shape,
                      DType dtype) {
  const char* descr = "<f4";
  switch (dtype) {
    case DType::f32: descr = "<f4"; break;
    case DType::f64: descr = "<f8"; break;
    case DType::f16: descr = "<f2"; break;
    case DType::bf16: descr = "<f4"; break;
    case DType::i32: descr = "<i4"; break;
    case DType::i64: descr = "<i8"; break;
    case DType::u8: descr = "|u1"; break;
  }
  std::string dims;
  std::int64_t count = 1;
  for (std::int64_t s : shape) {
    dims += std::to_string(s) + ",";
    count *= s;
  }
  if (shape.size() > 1) dims.pop_back();
  std::string header =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64 and
  // ended by a newline.
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw error("cannot write " + path);
  const unsigned char preamble[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(reinterpret_cast<const char*>(preamble), 8);
  const auto length = static_cast<std::uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(length & 0xff), static_cast<char>(length >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  if (dtype == DType::bf16) {
    std::vector<float> wide(static_cast<std::size_t>(count));
    for (std::size_t i = 0; i < wide.size(); ++i) {
      bf16_t v{};
      std::memcpy(&v, data + 2 * i, 2);
      wide[i] = detail::to_float(v);
    }
    out.write(reinterpret_cast<const char*>(wide.data()),
              static_cast<std::streamsize>(wide.size() * 4));
  } else {
    out.write(reinterpret_cast<const char*>(data),
              static_cast<std::streamsize>(count * static_cast<std::int64_t>(size_of(dtype))));
  }
  if (!out) throw error("cannot write " + path);
}

}  // namespace dtensor
