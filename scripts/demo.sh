#!/usr/bin/env bash
# Plans and explains a redistribution (arguments go to dtensor-plan; a 2x4 example without).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target dtensor-plan >/dev/null
if [ $# -eq 0 ]; then
  set -- --mesh 2x4 --names dp,tp --shape 1024x4096 --dtype bf16 --from 'S(0),R' --to 'R,S(0)'
fi
exec build/release/examples/dtensor-plan "$@"
