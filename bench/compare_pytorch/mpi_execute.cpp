// End-to-end execution time of dtensor plans on the MPI backend, for compare.py:
//   mpirun -np N compare_mpi_execute CASES RUNS
// CASES holds one case per line, MESH SHAPE FROM TO (f32, dtensor-plan's spellings; the mesh
// has N ranks). Every rank fills its source block with ones, runs execute(plan, MpiBackend)
// once to warm up and RUNS times timed; rank 0 prints one line per case: the median over the
// runs of the slowest rank's seconds, then the plan's bytes_recv_max.
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>

#include <fmt/core.h>
#include <mpi.h>

#include "../mpi_timing.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace dtensor;

int run(int argc, char** argv) {
  if (argc != 3) {
    fmt::print(stderr, "usage: mpirun -np N compare_mpi_execute CASES RUNS\n");
    return 2;
  }
  const int runs = std::max(1, std::atoi(argv[2]));
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::ifstream cases(argv[1]);
  std::string line;
  while (std::getline(cases, line)) {
    std::istringstream fields(line);
    std::string mesh, shape, from, to;
    if (!(fields >> mesh >> shape >> from >> to)) {
      fmt::print(stderr, "compare_mpi_execute: expected 'MESH SHAPE FROM TO', got '{}'\n", line);
      return 2;
    }
    const DeviceMesh m = parse_mesh(mesh);
    const Shape s = parse_shape(shape);
    const Layout src(m, parse_placements(from), s, DType::f32);
    const Layout dst(m, parse_placements(to), s, DType::f32);
    const Plan plan = plan_redistribute(src, dst);
    MpiBackend backend(m);
    std::vector<float> in(static_cast<std::size_t>(src.local_numel(rank)), 1.0f);
    std::vector<float> out(static_cast<std::size_t>(dst.local_numel(rank)));
    const double seconds = bench::median_seconds(
        [&] { execute(plan, backend, std::span<const float>(in), std::span<float>(out)); }, runs,
        1);
    if (rank == 0) fmt::print("{:.6e} {}\n", seconds, plan.bytes_recv_max());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 2;
  try {
    status = run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "compare_mpi_execute: {}\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return status;
}
