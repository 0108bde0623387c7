#pragma once
// A simulated world per mesh for the whole test program: its ranks' threads start once, not
// once per plan (thread starts dominated the simulated runs' time).
#include <dtensor/backend/simulated.hpp>
#include <dtensor/batch_plan.hpp>
#include <dtensor/verify.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

namespace dtensor::testing {

// The world of `mesh`, made on first use, its counters reset. At most `kept` worlds live (the
// least recently used goes): a reference holds until the next call.
inline SimulatedWorld& world_of(const DeviceMesh& mesh, std::size_t kept = 16) {
  static std::vector<std::unique_ptr<SimulatedWorld>> worlds;  // the most recent last
  const auto it =
      std::find_if(worlds.begin(), worlds.end(), [&](const auto& w) { return w->mesh() == mesh; });
  if (it != worlds.end()) {
    std::rotate(it, it + 1, worlds.end());
  } else {
    if (worlds.size() >= kept) worlds.erase(worlds.begin());
    worlds.push_back(std::make_unique<SimulatedWorld>(mesh));
  }
  worlds.back()->reset_counters();
  return *worlds.back();
}

// verify_batch_on_simulator on the world of the batch's mesh.
template <std::size_t N>
BatchVerification verified_batch(const BatchPlan<N>& batch) {
  if (batch.empty()) return verify_batch_on_simulator(batch);
  return verify_batch_on_simulator(batch, world_of(batch[0].src().mesh()));
}

}  // namespace dtensor::testing
