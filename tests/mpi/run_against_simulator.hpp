#pragma once

// One plan run over MPI on every rank's block of the global view and checked on rank 0
// against the simulated backend's result, which verify_on_simulator checks against the global
// view; and the scratch each rank held against what the executor plans for it on MPI.
#include <dtensor/backend/mpi.hpp>
#include <dtensor/dtensor.hpp>
#include <dtensor/execute.hpp>
#include <dtensor/verify.hpp>

#include <fmt/core.h>

#include "../simulated_worlds.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

namespace dtensor::testing {

// Runs one case; on rank 0 returns what differs ("" when nothing). `stats` (when given) gets
// this rank's. With `one_buffer`, the source and target are one buffer (in place).
template <class T>
std::string run_against_simulator(const Layout& src, const Layout& dst, MpiBackend& backend,
                                  ExecuteStats* stats = nullptr, const PlanOptions& options = {},
                                  bool one_buffer = false, bool async = false) {
  const Plan plan = plan_redistribute(src, dst, options);
  const int rank = backend.rank();
  const DeviceMesh& mesh = src.mesh();
  const std::vector<T> in = global_view_block<T>(src, rank);
  std::vector<T> out(static_cast<std::size_t>(dst.local_numel(rank)));
  if (one_buffer) out = in;
  std::string problem;
  ExecuteStats held;
  try {
    const void* from = one_buffer ? static_cast<const void*>(out.data()) : in.data();
    const std::size_t from_bytes = (one_buffer ? out.size() : in.size()) * sizeof(T);
    if (async) {  // started, polled a few times, waited for: the same results and scratch
      Execution<MpiBackend> e =
          execute_async(plan, backend, from, from_bytes, out.data(), out.size() * sizeof(T));
      for (int i = 0; i < 3 && !e.test(); ++i) {
      }
      e.wait();
      held.scratch_peak_bytes = e.scratch_peak_bytes();
    } else {
      execute(plan, backend, from, from_bytes, out.data(), out.size() * sizeof(T), &held);
    }
  } catch (const std::exception& e) {
    problem = fmt::format("rank {} threw: {}", rank, e.what());
  }
  if (stats != nullptr) *stats = held;
  // Exactly the scratch the executor plans for this rank on this backend (blocks in the target,
  // steps in place, strided pieces, reductions by messages as its options say).
  const std::int64_t planned = workspace_bytes(plan, backend, rank);
  if (problem.empty() && held.scratch_peak_bytes != planned)
    problem = fmt::format("rank {} held {} scratch bytes, planned {}", rank,
                          held.scratch_peak_bytes, planned);
  // Gather every rank's result on rank 0, in mesh order.
  const int mine = static_cast<int>(out.size() * sizeof(T));
  std::vector<int> sizes(static_cast<std::size_t>(mesh.size())), offsets(sizes.size());
  MPI_Gather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) offsets[i] = total, total += sizes[i];
  std::vector<std::byte> all(static_cast<std::size_t>(rank == 0 ? total : 0));
  MPI_Gatherv(out.data(), mine, MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE, 0,
              MPI_COMM_WORLD);
  if (rank != 0) return problem;
  const Verification reference = verify_on_simulator(plan, testing::world_of(mesh));
  if (!reference.verified) return "the simulated reference fails: " + reference.difference;
  const double tolerance = src.dtype() == DType::bf16 ? 1e-2 : is_floating(src.dtype()) ? 1e-6 : 0;
  for (int i = 0; i < mesh.size() && problem.empty(); ++i) {
    const auto& want = reference.results[static_cast<std::size_t>(i)];
    if (want.size() != static_cast<std::size_t>(sizes[static_cast<std::size_t>(i)]))
      return fmt::format("rank {} returned {} bytes, expected {}", i,
                         sizes[static_cast<std::size_t>(i)], want.size());
    const auto* got = reinterpret_cast<const T*>(all.data() + offsets[static_cast<std::size_t>(i)]);
    const auto* exp = reinterpret_cast<const T*>(want.data());
    for (std::size_t e = 0; e < want.size() / sizeof(T); ++e) {
      const double a = double(detail::widen(got[e])), b = double(detail::widen(exp[e]));
      if (std::abs(a - b) > tolerance * std::max(1.0, std::abs(b))) {
        problem = fmt::format("rank {} element {}: MPI {} vs simulated {}", i, e, a, b);
        break;
      }
    }
  }
  return problem;
}

}  // namespace dtensor::testing
