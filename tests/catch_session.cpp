// Catch2's implementation, compiled once for every test program (tests/main.cpp's and the GPU
// tests' tests/cuda/main.cpp supply main() and call run_catch_session).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.hpp"

int dtensor::testing::run_catch_session(int argc, char** argv) {
  return Catch::Session().run(argc, argv);
}
