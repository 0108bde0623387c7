#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "format.hpp"
#include "layout.hpp"

// Sharding pictures: which ranks hold each block of a tensor, drawn as a grid (what
// jax.debug.visualize_array_sharding and DTensor's visualize_sharding show).
namespace dtensor {

namespace detail {

// "0-3", "0, 4", "0-1, 4-5": sorted ranks with runs folded.
inline std::string rank_set_text(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

// The sorted distinct cut points of tensor dim `d` over every rank's block.
inline std::vector<std::int64_t> cut_points(const Layout& layout, int d) {
  std::vector<std::int64_t> cuts{0, layout.global_shape()[d]};
  for (int i = 0; i < layout.mesh().size(); ++i) {
    const Box b = layout.local_box(layout.mesh().rank_at(i));
    if (b.empty()) continue;
    cuts.push_back(b.offset[d]);
    cuts.push_back(b.offset[d] + b.shape[d]);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

inline std::string repeat(std::string_view s, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

}  // namespace detail

// The most blocks per tensor dim a picture draws; beyond it the picture says so instead.
inline constexpr std::size_t max_picture_blocks = 32;

// A grid of the global tensor (1-D or 2-D) with the ranks holding each block, followed by a
// line for each Partial mesh dim and for ranks holding no elements. Other tensor ranks get one
// line per rank with its block.
inline std::string sharding_picture(const Layout& layout) {
  const DeviceMesh& mesh = layout.mesh();
  std::string out;
  const int nd = layout.tensor_ndim();
  if (nd == 1 || nd == 2) {
    const std::vector<std::int64_t> rows =
        nd == 2 ? detail::cut_points(layout, 0) : std::vector<std::int64_t>{0, 1};
    const std::vector<std::int64_t> cols = detail::cut_points(layout, nd - 1);
    const std::size_t nrows = rows.size() - 1, ncols = cols.size() - 1;
    if (nrows > max_picture_blocks || ncols > max_picture_blocks) {
      out += fmt::format("({} x {} blocks: too many to draw)\n", nrows, ncols);
    } else if (nrows >= 1 && ncols >= 1) {
      std::vector<std::string> cells(nrows * ncols), row_labels(nrows), col_labels(ncols);
      for (std::size_t r = 0; r < nrows; ++r)
        row_labels[r] = nd == 2 ? fmt::format("{}:{}", rows[r], rows[r + 1]) : "";
      for (std::size_t c = 0; c < ncols; ++c)
        col_labels[c] = fmt::format("{}:{}", cols[c], cols[c + 1]);
      for (std::size_t r = 0; r < nrows; ++r) {
        for (std::size_t c = 0; c < ncols; ++c) {
          std::vector<int> holders;
          for (int i = 0; i < mesh.size(); ++i) {
            const int rank = mesh.rank_at(i);
            const Box b = layout.local_box(rank);
            const bool row_in =
                nd == 1 || (b.offset[0] <= rows[r] && rows[r] < b.offset[0] + b.shape[0]);
            const std::int64_t o = b.offset[nd - 1], s = b.shape[nd - 1];
            if (row_in && o <= cols[c] && cols[c] < o + s) holders.push_back(rank);
          }
          cells[r * ncols + c] = detail::rank_set_text(holders);
        }
      }
      std::size_t label_w = 0;
      for (const auto& l : row_labels) label_w = std::max(label_w, l.size());
      std::vector<std::size_t> width(ncols);
      for (std::size_t c = 0; c < ncols; ++c) {
        width[c] = col_labels[c].size();
        for (std::size_t r = 0; r < nrows; ++r)
          width[c] = std::max(width[c], cells[r * ncols + c].size());
        width[c] += 2;
      }
      auto rule = [&](std::string_view left, std::string_view mid, std::string_view right) {
        std::string line(label_w + (label_w > 0 ? 1 : 0), ' ');
        line += left;
        for (std::size_t c = 0; c < ncols; ++c) {
          line += detail::repeat("─", width[c]);
          line += c + 1 < ncols ? mid : right;
        }
        return line + "\n";
      };
      std::string header(label_w + (label_w > 0 ? 1 : 0) + 1, ' ');
      for (std::size_t c = 0; c < ncols; ++c)
        header += fmt::format("{:^{}} ", col_labels[c], width[c]);
      while (!header.empty() && header.back() == ' ') header.pop_back();
      out += header + "\n";
      out += rule("┌", "┬", "┐");
      for (std::size_t r = 0; r < nrows; ++r) {
        out += fmt::format("{:>{}}{}│", row_labels[r], label_w, label_w > 0 ? " " : "");
        for (std::size_t c = 0; c < ncols; ++c)
          out += fmt::format("{:^{}}│", cells[r * ncols + c], width[c]);
        out += "\n";
        out += r + 1 < nrows ? rule("├", "┼", "┤") : rule("└", "┴", "┘");
      }
    }
  } else {
    for (int i = 0; i < mesh.size(); ++i) {
      const int rank = mesh.rank_at(i);
      out += fmt::format("rank {}: {}\n", rank, layout.local_box(rank));
    }
  }
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = layout.placement(i);
    if (!p.is_partial()) continue;
    const std::string_view nm = mesh.name(i);
    out += fmt::format(
        "partial over mesh dim {}{}{}{}: each cell's ranks hold parts whose {} is the value\n", i,
        nm.empty() ? "" : " (", nm, nm.empty() ? "" : ")", p.reduce_op());
  }
  std::vector<int> empty_ranks;
  for (int i = 0; i < mesh.size(); ++i)
    if (layout.local_box(mesh.rank_at(i)).empty()) empty_ranks.push_back(mesh.rank_at(i));
  if (!empty_ranks.empty())
    out += fmt::format("ranks holding no elements: {}\n", detail::rank_set_text(empty_ranks));
  return out;
}

}  // namespace dtensor
