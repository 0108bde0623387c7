#pragma once

// Timing for the MPI benchmarks: the median over runs of the slowest rank's seconds.
#include <mpi.h>

#include <algorithm>
#include <vector>

namespace dtensor::bench {

// Median over `runs` timed calls of f, after `warmup` untimed ones, of the slowest rank's
// seconds (a barrier before each call), agreed on by every rank.
template <class F>
double median_seconds(F&& f, int runs, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> samples;
  for (int i = 0; i < runs; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    f();
    double elapsed = MPI_Wtime() - start, slowest = 0;
    MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    samples.push_back(slowest);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace dtensor::bench
