#pragma once

#include <mpi.h>
#include <nccl.h>

#include "../errors.hpp"
#include "nccl.cuh"

// Creating the NCCL world communicator over MPI: rank 0 of the MPI communicator makes the
// unique id and broadcasts it.
namespace dtensor {

// One NCCL rank per process of `comm`, NCCL rank = MPI rank; collective over `comm`. Each
// process must have selected its GPU (cudaSetDevice) first.
inline NcclComm nccl_world(MPI_Comm comm) {
  int rank = 0, size = 0;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS)
    throw error("nccl_world: MPI_Comm_rank or MPI_Comm_size failed");
  ncclUniqueId id{};
  if (rank == 0) id = nccl_unique_id();
  if (MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm) != MPI_SUCCESS)
    throw error("nccl_world: MPI_Bcast of the NCCL unique id failed");
  return NcclComm(id, size, rank);
}

}  // namespace dtensor
