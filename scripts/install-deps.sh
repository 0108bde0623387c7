#!/usr/bin/env bash
# Installs the Debian packages dtensor builds and tests with, when any is missing.
set -euo pipefail
packages=(cmake g++ ninja-build ccache catch2 libfmt-dev libeigen3-dev libopenmpi-dev openmpi-bin
          clang clang-format clang-tidy libbenchmark-dev libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "dtensor: installing missing Debian packages: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "dtensor: not root and no sudo; run as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
