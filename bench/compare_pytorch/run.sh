#!/usr/bin/env bash
# dtensor side by side with PyTorch DTensor (issue 9): installs what it needs, builds our side
# and runs bench/compare_pytorch/compare.py. See bench/compare_pytorch/README.md.
#
#   bash bench/compare_pytorch/run.sh            # every case (about 4 minutes once installed)
#   bash bench/compare_pytorch/run.sh --smoke    # two cases (under a minute once installed)
#
# Other arguments go to compare.py (--runs N: timed runs per execution case).
# Writes build/compare-pytorch/compare.md and compare.csv (smoke: compare-smoke.md, .csv).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
venv=build/compare-venv
# The PyTorch the figures in README.md were taken with; override to try another.
torch_spec="${TORCH_SPEC:-torch==2.15.0}"

# The project's Debian packages (compiler, CMake, fmt, Open MPI, ...).
bash scripts/install-deps.sh

# A virtual environment with PyTorch and NumPy. PyPI serves one Linux build of torch, with its
# CUDA libraries as dependencies (about 5 GiB installed); its CPU side is what runs here.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq python3-venv
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if ! "$venv/bin/python" -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "compare_pytorch: installing $torch_spec and numpy into $venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "$torch_spec" numpy
fi

# Our side: the CLI and the two drivers only.
[ -f build/release/CMakeCache.txt ] || cmake --preset release >/dev/null
cmake --build --preset release --target dtensor-plan compare_plan_time compare_mpi_execute

exec "$venv/bin/python" bench/compare_pytorch/compare.py --build build/release \
  --out build/compare-pytorch "$@"
