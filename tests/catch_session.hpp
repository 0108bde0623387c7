#pragma once
// Runs Catch2's session over the registered tests (tests/catch_session.cpp, which compiles
// Catch2's implementation once for every test program).
namespace dtensor::testing {
int run_catch_session(int argc, char** argv);
}
