#!/usr/bin/env bash
# Builds dtensor and runs the whole test suite (DTENSOR_PRESET picks the preset; default dev).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
preset=${DTENSOR_PRESET:-dev}
cmake --preset "$preset"
cmake --build --preset "$preset"
ctest --preset "$preset"
