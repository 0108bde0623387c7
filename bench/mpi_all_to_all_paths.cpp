// Ways to move an all-to-all's strided pieces between processes of one machine, timed against
// the contiguous MPI_Alltoall: the measurement behind the MPI backend's choice of a derived
// datatype for S(i) -> S(j) (bench/README.md). Each rank holds a row-major [rows, 1024] f32
// block and sends member j the columns [j * 1024 / n, (j + 1) * 1024 / n) of every row.
// Run: mpirun -np 8 build/release/bench/bench_mpi_all_to_all_paths [runs]
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>

#include <fmt/core.h>
#include <mpi.h>

#include "mpi_timing.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#ifdef __linux__
#include <sys/uio.h>
#include <unistd.h>
#endif

namespace {

using namespace dtensor;

// One rank's side of the exchange: its block, the target, and where every peer's target is.
struct Exchange {
  int rank = 0, size = 0;
  std::size_t rows = 0, run = 0, stride = 0;  // bytes: one row's piece, one row
  std::vector<float> src, dst;
  [[nodiscard]] std::size_t piece() const { return rows * run; }
  [[nodiscard]] const char* run_of(int peer, std::size_t row) const {
    return reinterpret_cast<const char*>(src.data()) + row * stride +
           static_cast<std::size_t>(peer) * run;
  }
};

#ifdef __linux__
// Every peer's process id and target address, for writing into it with process_vm_writev.
struct Peers {
  std::vector<int> pids;
  std::vector<std::uintptr_t> targets;
};

Peers peers_of(const Exchange& x) {
  Peers p;
  p.pids.resize(static_cast<std::size_t>(x.size));
  p.targets.resize(static_cast<std::size_t>(x.size));
  const int pid = getpid();
  const auto target = reinterpret_cast<std::uintptr_t>(x.dst.data());
  MPI_Allgather(&pid, 1, MPI_INT, p.pids.data(), 1, MPI_INT, MPI_COMM_WORLD);
  MPI_Allgather(&target, sizeof target, MPI_BYTE, p.targets.data(), sizeof target, MPI_BYTE,
                MPI_COMM_WORLD);
  return p;
}

// Writes `local` into peer's target at byte `offset` (the whole of it, or false).
bool write_to(const Exchange& x, const Peers& p, int peer, std::size_t offset, const iovec* local,
              std::size_t count, std::size_t bytes) {
  const std::size_t at = static_cast<std::size_t>(peer);
  if (peer == x.rank) {
    char* out = reinterpret_cast<char*>(p.targets[at]) + offset;
    for (std::size_t i = 0; i < count; ++i) {
      std::memcpy(out, local[i].iov_base, local[i].iov_len);
      out += local[i].iov_len;
    }
    return true;
  }
  iovec remote{reinterpret_cast<void*>(p.targets[at] + offset), bytes};
  return process_vm_writev(p.pids[at], local, count, &remote, 1, 0) == static_cast<ssize_t>(bytes);
}

// Writes every peer's piece, `rows_per` rows at a time, starting with the next rank's:
// `write(peer, row, m)` writes rows [row, row + m) of that peer's piece. Then waits until every
// write into this rank's target has landed.
template <class Write>
bool write_pieces(const Exchange& x, std::size_t rows_per, Write&& write) {
  bool ok = true;
  for (int k = 0; k < x.size; ++k) {
    const int peer = (x.rank + k) % x.size;
    for (std::size_t row = 0; row < x.rows; row += rows_per)
      ok = write(peer, row, std::min(rows_per, x.rows - row)) && ok;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return ok;
}

// The kernel's single copy, gathering the rows where they lie: one iovec per row.
bool cma_per_row(Exchange& x, const Peers& p) {
  constexpr std::size_t max_iov = 1024;  // IOV_MAX on Linux
  std::vector<iovec> local(max_iov);
  return write_pieces(x, max_iov, [&](int peer, std::size_t row, std::size_t m) {
    for (std::size_t i = 0; i < m; ++i)
      local[i] = {const_cast<char*>(x.run_of(peer, row + i)), x.run};
    return write_to(x, p, peer, x.rank * x.piece() + row * x.run, local.data(), m, m * x.run);
  });
}

// Packed 64 KiB at a time into a buffer that stays in cache, then one contiguous write.
bool cma_packed(Exchange& x, const Peers& p) {
  const std::size_t rows_per = std::max<std::size_t>(1, (std::size_t{64} << 10) / x.run);
  std::vector<char> staging(rows_per * x.run);
  return write_pieces(x, rows_per, [&](int peer, std::size_t row, std::size_t m) {
    for (std::size_t i = 0; i < m; ++i)
      std::memcpy(staging.data() + i * x.run, x.run_of(peer, row + i), x.run);
    iovec local{staging.data(), m * x.run};
    return write_to(x, p, peer, x.rank * x.piece() + row * x.run, &local, 1, m * x.run);
  });
}
#endif

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Exchange x;
  MPI_Comm_rank(MPI_COMM_WORLD, &x.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &x.size);
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 10;
  const DeviceMesh mesh({x.size});
  MpiBackend backend(mesh);
  // CMA reaches only processes of this machine.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  if (x.rank == 0)
    fmt::print(
        "# {} ranks, f32 [rows, 1024] S(0) -> S(1), median of {} runs, ms; size = the global "
        "tensor\n{:>8} {:>11} {:>9} {:>9} {:>9} {:>11} {:>11}\n",
        x.size, runs, "size", "contiguous", "datatype", "dtensor", "cma/row", "cma/packed",
        "best/contig");
  for (std::int64_t mib : {16, 64}) {
    const std::int64_t rows = mib * 1024 * 1024 / (1024 * 4);
    x.rows = static_cast<std::size_t>(rows / x.size);
    x.stride = 1024 * sizeof(float);
    x.run = x.stride / static_cast<std::size_t>(x.size);
    x.src.assign(x.rows * 1024, 0.0f);
    for (std::size_t i = 0; i < x.src.size(); ++i)
      x.src[i] = static_cast<float>(x.rank * 1e7 + static_cast<double>(i));
    x.dst.assign(x.src.size(), 0.0f);
    std::vector<float> expected(x.src.size());
    const int n = static_cast<int>(x.piece());

    MPI_Datatype vector = MPI_DATATYPE_NULL, pieces = MPI_DATATYPE_NULL;
    MPI_Type_create_hvector(static_cast<int>(x.rows), static_cast<int>(x.run),
                            static_cast<MPI_Aint>(x.stride), MPI_BYTE, &vector);
    MPI_Type_create_resized(vector, 0, static_cast<MPI_Aint>(x.run), &pieces);
    MPI_Type_commit(&pieces);
    MPI_Alltoall(x.src.data(), 1, pieces, expected.data(), n, MPI_BYTE, MPI_COMM_WORLD);

    const double contiguous = bench::median_seconds(
        [&] { MPI_Alltoall(x.src.data(), n, MPI_BYTE, x.dst.data(), n, MPI_BYTE, MPI_COMM_WORLD); },
        runs);
    const double datatype = bench::median_seconds(
        [&] { MPI_Alltoall(x.src.data(), 1, pieces, x.dst.data(), n, MPI_BYTE, MPI_COMM_WORLD); },
        runs);
    const Layout src(mesh, parse_placements("S(0)"), {rows, 1024}, DType::f32);
    const Layout dst(mesh, parse_placements("S(1)"), {rows, 1024}, DType::f32);
    const Plan plan = plan_redistribute(src, dst);
    const double library = bench::median_seconds(
        [&] { execute(plan, backend, std::span<const float>(x.src), std::span<float>(x.dst)); },
        runs);
    int same = x.dst == expected ? 1 : 0;
    double per_row = 0, packed = 0;
#ifdef __linux__
    int usable = node_size == x.size ? 1 : 0;
    if (usable != 0) {
      const Peers peers = peers_of(x);
      // A path counts only where it works and gives the datatype call's bytes on every rank.
      auto check = [&](bool (*path)(Exchange&, const Peers&)) {
        std::fill(x.dst.begin(), x.dst.end(), 0.0f);
        MPI_Barrier(MPI_COMM_WORLD);  // no peer writes into it before it is cleared
        int ok = path(x, peers) && x.dst == expected ? 1 : 0;
        MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        return ok != 0;
      };
      if (check(cma_per_row) && check(cma_packed)) {
        per_row = bench::median_seconds([&] { cma_per_row(x, peers); }, runs);
        packed = bench::median_seconds([&] { cma_packed(x, peers); }, runs);
      } else {
        usable = 0;
      }
    }
    if (usable == 0 && x.rank == 0)
      fmt::print("# process_vm_writev unusable here (other machines, or not permitted)\n");
#endif
    MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Type_free(&pieces);
    MPI_Type_free(&vector);
    if (x.rank != 0) continue;
    if (same == 0) fmt::print("# dtensor's result differs from the datatype call's\n");
    double best = std::min(datatype, library);
    for (const double t : {per_row, packed})
      if (t > 0) best = std::min(best, t);
    fmt::print("{:>5} MiB {:>11.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>11.2f} {:>11.2f}\n", mib,
               contiguous * 1e3, datatype * 1e3, library * 1e3, per_row * 1e3, packed * 1e3,
               best / contiguous);
  }
  MPI_Finalize();
  return 0;
}
