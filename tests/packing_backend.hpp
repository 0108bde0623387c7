#pragma once

// The simulator as a backend without StridedAllToAll or StridedAllGather: the executor packs an
// all-to-all's pieces before sending them and unpacks an all-gather's, as on NCCL (the
// simulator itself moves strided pieces where they lie, as MPI does).
#include <dtensor/backend/simulated.hpp>

#include "forwarding_backend.hpp"

namespace dtensor::testing {

// SimulatedBackend with only the Backend concept's five operations.
using PackingBackend = ForwardingBackend<SimulatedBackend>;

}  // namespace dtensor::testing
