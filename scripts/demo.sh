#!/usr/bin/env bash
# Plans, explains and executes a redistribution on simulated ranks (arguments go to
# dtensor-plan; without, a 2x4 example with --execute).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target dtensor-plan >/dev/null
if [ $# -eq 0 ]; then
  set -- --mesh 2x4 --names dp,tp --shape 1024x4096 --dtype bf16 --from 'S(0),R' --to 'R,S(0)' --execute
fi
exec build/release/examples/dtensor-plan "$@"
