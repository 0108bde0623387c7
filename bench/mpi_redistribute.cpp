// A redistribution over MPI against the bare MPI collective moving the same bytes, per message
// size, nccl-tests style. Run: mpirun -np 8 build/release/bench/bench_mpi_redistribute [runs]
// [collective] [chunk] [direct] [band] [async] [sizes] [messages] ([collective]: only the rows
// whose collective starts with that name, e.g. all_to_all; [chunk]:
// MpiBackend::Options::single_copy_chunk_bytes in KiB; [direct]:
// single_copy_direct_write_from_bytes and _read_from_bytes in bytes, -1 for never; [band]:
// single_copy_band_bytes in KiB; [async]: 1 to run each redistribution as
// execute_async(...).wait(); [sizes]: the larger side per rank in KiB, comma-separated, by
// default 1024,4096,16384,65536; [messages]: move_by_messages_below_bytes and
// reduce_by_messages_from_bytes in KiB, "never" or "always" for both; [threads]:
// single_copy_threads, 0 for as many as the rank has cores; [threads from]:
// single_copy_threads_from_bytes in KiB; "-" keeps an option's default)
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>

#include <fmt/core.h>
#include <mpi.h>

#include "mpi_timing.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace dtensor;

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int iterations = argc > 1 ? std::max(1, std::atoi(argv[1])) : 10;
  const std::string_view only = argc > 2 ? argv[2] : "";
  const DeviceMesh mesh({size});
  // The options after [collective] ("-" keeps an option's default).
  const auto given = [&](int i) { return argc > i && std::string_view(argv[i]) != "-"; };
  MpiBackend::Options options;
  // [chunk KiB]: MpiBackend::Options::single_copy_chunk_bytes.
  if (given(3))
    options.single_copy_chunk_bytes = std::size_t(std::max(1, std::atoi(argv[3]))) << 10;
  // [direct bytes]: MpiBackend::Options::single_copy_direct_write_from_bytes and
  // single_copy_direct_read_from_bytes (-1: never).
  if (given(4))
    options.single_copy_direct_write_from_bytes = options.single_copy_direct_read_from_bytes =
        std::atoi(argv[4]) < 0 ? std::numeric_limits<std::size_t>::max()
                               : std::size_t(std::atoi(argv[4]));
  // [band KiB]: MpiBackend::Options::single_copy_band_bytes.
  if (given(5)) options.single_copy_band_bytes = std::size_t(std::max(1, std::atoi(argv[5]))) << 10;
  // [async]: started by execute_async and waited for.
  const bool async = given(6) && std::atoi(argv[6]) == 1;
  // [sizes KiB].
  std::vector<std::int64_t> sizes_kib{1024, 4096, 16384, 65536};
  if (given(7)) {
    sizes_kib.clear();
    for (std::string_view rest = argv[7]; !rest.empty();) {
      const std::size_t comma = std::min(rest.find(','), rest.size());
      sizes_kib.push_back(
          std::max<std::int64_t>(4, std::atoll(std::string(rest.substr(0, comma)).c_str())));
      rest.remove_prefix(std::min(comma + 1, rest.size()));
    }
  }
  // [messages KiB]: the point-to-point rounds' thresholds.
  if (given(8)) {
    const std::string_view m = argv[8];
    const std::size_t kib = m == "never"    ? 0
                            : m == "always" ? std::numeric_limits<std::size_t>::max() >> 10
                                            : std::size_t(std::max(0, std::atoi(argv[8])));
    options.move_by_messages_below_bytes = kib << 10;
    options.reduce_by_messages_from_bytes = m == "never" ? std::numeric_limits<std::size_t>::max()
                                            : m == "always" ? 0
                                                            : kib << 10;
  }
  // [threads]: MpiBackend::Options::single_copy_threads.
  if (given(9)) options.single_copy_threads = unsigned(std::max(0, std::atoi(argv[9])));
  // [threads from KiB]: MpiBackend::Options::single_copy_threads_from_bytes.
  if (given(10))
    options.single_copy_threads_from_bytes = std::size_t(std::max(0, std::atoi(argv[10]))) << 10;
  MpiBackend backend(mesh, MPI_COMM_WORLD, options);
  struct Case {
    std::string_view name, from, to;
    double busbw_factor;  // nccl-tests: bus bandwidth = algbw * factor
  };
  const Case cases[] = {{"all_gather", "S(0)", "R", double(size - 1) / size},
                        // Columns: the pieces land side by side in the target (StridedAllGather).
                        {"all_gather_cols", "S(1)", "R", double(size - 1) / size},
                        {"reduce_scatter", "P", "S(0)", double(size - 1) / size},
                        // Columns: the pieces go where they lie, as one point-to-point round
                        // (StridedExchange), against the contiguous collective.
                        {"reduce_scatter_cols", "P", "S(1)", double(size - 1) / size},
                        {"all_reduce", "P", "R", 2.0 * (size - 1) / size},
                        {"all_to_all", "S(0)", "S(1)", double(size - 1) / size},
                        // The reverse: pieces received side by side in the target.
                        {"all_to_all_rows", "S(1)", "S(0)", double(size - 1) / size},
                        // The same plan against MPI_Alltoall sending the same strided pieces
                        // with a derived datatype, as a hand-written MPI program would.
                        {"all_to_all_dtype", "S(0)", "S(1)", double(size - 1) / size}};
  if (rank == 0)
    fmt::print(
        "# {} ranks, f32, median of {} runs; size = bytes per rank of the larger side; {} "
        "thread(s) per large single copy\n"
        "{:>16} {:>10} {:>12} {:>12} {:>10} {:>10} {:>8}\n",
        size, iterations, backend.single_copy_threads(), "collective", "size", "dtensor us",
        "bare MPI us", "algbw", "busbw", "ratio");
  for (const Case& c : cases) {
    if (!c.name.starts_with(only)) continue;
    for (const std::int64_t kib : sizes_kib) {
      // A [rows, cols] f32 tensor whose larger per-rank side is `kib` KiB: `kib` KiB in all
      // where a side replicates or holds partials, `size` times that where both shard; 1024
      // columns, or fewer where that leaves fewer rows than ranks.
      const std::int64_t cols = std::clamp<std::int64_t>(kib * 1024 / (4 * size), size, 1024);
      const std::int64_t row_bytes = cols * 4;
      const std::int64_t full_rows = kib * 1024 / row_bytes;
      const auto layout = [&](std::string_view placements, std::int64_t rows) {
        return Layout(mesh, parse_placements(placements), {rows, cols}, DType::f32);
      };
      const std::int64_t larger = std::max(layout(c.from, full_rows).max_local_bytes(),
                                           layout(c.to, full_rows).max_local_bytes());
      const std::int64_t rows = full_rows * (full_rows * row_bytes / larger);
      const Layout src = layout(c.from, rows);
      const Layout dst = layout(c.to, rows);
      const Plan plan = plan_redistribute(src, dst);
      std::vector<float> in(static_cast<std::size_t>(src.local_numel(rank)), 1.0f);
      std::vector<float> out(static_cast<std::size_t>(dst.local_numel(rank)));
      const double ours = bench::median_seconds(
          [&] {
            if (async)
              execute_async(plan, backend, std::span<const float>(in), std::span<float>(out))
                  .wait();
            else
              execute(plan, backend, std::span<const float>(in), std::span<float>(out));
          },
          iterations);
      // The bare collective on the same buffers.
      const auto count = static_cast<int>(std::min(in.size(), out.size()));
      // all_to_all_dtype: member j's piece is columns [j * 1024 / size, (j + 1) * 1024 / size)
      // of every local row.
      const auto run = static_cast<int>(cols / size * 4);
      MPI_Datatype vector = MPI_DATATYPE_NULL, columns = MPI_DATATYPE_NULL;
      MPI_Type_create_hvector(static_cast<int>(in.size() / static_cast<std::size_t>(cols)), run,
                              cols * 4, MPI_BYTE, &vector);
      MPI_Type_create_resized(vector, 0, run, &columns);
      MPI_Type_commit(&columns);
      MPI_Type_free(&vector);
      const double bare = bench::median_seconds(
          [&] {
            if (c.name.starts_with("all_gather"))
              MPI_Allgather(in.data(), static_cast<int>(in.size()), MPI_FLOAT, out.data(),
                            static_cast<int>(in.size()), MPI_FLOAT, MPI_COMM_WORLD);
            else if (c.name.starts_with("reduce_scatter"))
              MPI_Reduce_scatter_block(in.data(), out.data(), static_cast<int>(out.size()),
                                       MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else if (c.name == "all_reduce")
              MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else if (c.name == "all_to_all" || c.name == "all_to_all_rows")
              MPI_Alltoall(in.data(), static_cast<int>(in.size()) / size, MPI_FLOAT, out.data(),
                           static_cast<int>(in.size()) / size, MPI_FLOAT, MPI_COMM_WORLD);
            else
              MPI_Alltoall(in.data(), 1, columns, out.data(), static_cast<int>(in.size()) / size,
                           MPI_FLOAT, MPI_COMM_WORLD);
          },
          iterations);
      MPI_Type_free(&columns);
      const double bytes = double(std::max(in.size(), out.size()) * sizeof(float));
      const double algbw = bytes / ours / 1e9;
      if (rank == 0)
        fmt::print("{:>16} {:>7} KiB {:>12.1f} {:>12.1f} {:>8.2f} GB/s {:>6.2f} GB/s {:>8.3f}\n",
                   c.name, kib, ours * 1e6, bare * 1e6, algbw, algbw * c.busbw_factor, ours / bare);
    }
  }
  MPI_Finalize();
  return 0;
}
