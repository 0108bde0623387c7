// The tests' main(): Catch2's session (its implementation is tests/catch_session.cpp).
#include "catch_session.hpp"

int main(int argc, char** argv) { return dtensor::testing::run_catch_session(argc, argv); }
