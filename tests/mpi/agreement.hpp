#pragma once

// The verdicts of an MPI test, agreed on by every rank: a check fails when it fails anywhere.
#include <mpi.h>

#include <fmt/core.h>

#include <string>

namespace dtensor::testing {

class Agreement {
 public:
  explicit Agreement(int rank) : rank_(rank) {}

  // Counts `name` as passed when `ok` on every rank; prints `why` where it is not.
  void agree(const std::string& name, bool ok, const std::string& why = "") {
    int bad = ok ? 0 : 1, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!ok) fmt::print(stderr, "rank {}: {} failed: {}\n", rank_, name, why);
    any ? ++failed_ : ++passed_;
  }
  [[nodiscard]] int passed() const { return passed_; }
  [[nodiscard]] int failed() const { return failed_; }

 private:
  int rank_;
  int passed_ = 0, failed_ = 0;
};

}  // namespace dtensor::testing
