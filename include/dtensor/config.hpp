#pragma once

#include <cstddef>

namespace dtensor {

// The most mesh dims a DeviceMesh holds (and so the most placements in a layout).
inline constexpr int max_mesh_dims = 8;
// The most dims a tensor may have.
inline constexpr int max_tensor_dims = 8;
// The longest mesh dim name, in characters.
inline constexpr std::size_t max_dim_name_length = 15;

}  // namespace dtensor
