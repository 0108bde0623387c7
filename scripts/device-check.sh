#!/usr/bin/env bash
# The checks that need a GPU, or more cores than CI has, as one run on a lent machine with one
# NVIDIA GPU and no network (the `device` tool of this workplace).
#
#   bash scripts/device-check.sh prepare   # here: builds the release binaries into .device/
#   bash scripts/device-check.sh run [gpu|mpi] [repeats]   # there, from the repository root
#                                                          # (carry .device)
#
# `prepare` builds the CUDA/NCCL tests, bench_cuda and the MPI tests and benchmarks, strips them into
# .device/bin, and fetches Debian's Open MPI packages into .device/debs (the lent machine has no
# MPI); `run` unpacks Open MPI into /tmp/ompi, runs the GPU tests and benchmarks, then the MPI
# tests and benchmarks with 8 ranks on cores of their own (two each, and one each), and writes
# every log to $OUT (or .device/out).
# .device/ is ignored by git (.git/info/exclude).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
dir=.device

if [[ $mode == prepare ]]; then
  set -e
  grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >>.git/info/exclude
  cmake --preset release >/dev/null
  targets=(test_cuda_device_execute test_cuda_nccl bench_cuda bench_mpi_redistribute
           bench_mpi_batch bench_mpi_all_to_all_paths test_mpi_execute test_mpi_random)
  cmake --build build/release --target "${targets[@]}"
  mkdir -p $dir/bin
  for t in "${targets[@]}"; do
    f=$(find build/release -name "$t" -type f -perm -u+x | head -1)
    strip -o $dir/bin/"$t" "$f"
  done
  bash "$(dirname "$0")/device-mpi.sh" download $dir/debs
  du -sh $dir
  exit 0
fi

if [[ $mode != run ]]; then
  echo "usage: $0 prepare|run" >&2
  exit 2
fi

only=${2:-all}
repeats=${3:-1}
out=${OUT:-$dir/out}
mkdir -p "$out"
log() { echo "== $*" | tee -a "$out/summary.txt"; }
bin=$dir/bin
# NCCL: the system's, else the one PyTorch's wheel brings.
if ! ldconfig -p | grep -q libnccl.so.2; then
  nccl=$(find / -name libnccl.so.2 -not -path '/proc/*' 2>/dev/null | head -1)
  [[ -n $nccl ]] && export LD_LIBRARY_PATH=$(dirname "$nccl")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{ nvidia-smi -L; nproc; ldd $bin/test_cuda_nccl | grep -E 'nccl|cudart'; } >"$out/machine.txt" 2>&1

step() {  # step NAME SECONDS COMMAND...: runs with a time limit, logs its outcome
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  log "$name: exit $rc in $((SECONDS - start)) s"
  grep -v -i 'pmix\|compress\|^--\|^$' "$out/$name.txt" | tail -4 | sed 's/^/   /' | tee -a "$out/summary.txt"
}

if [[ $only != mpi ]]; then
  step cuda_nccl 120 $bin/test_cuda_nccl
  step cuda_device_execute 300 $bin/test_cuda_device_execute
  step bench_cuda 120 $bin/bench_cuda
fi

if [[ $only == gpu ]]; then
  :
elif source "$(dirname "$0")/device-mpi.sh" env /tmp/ompi $dir/debs; then
  # A core per rank, and two (the machine's 16 cores shared out: a large single copy runs in
  # two threads, MpiBackend::Options::single_copy_threads).
  mpi="mpirun -np 8 --bind-to core --map-by core"
  mpi2="mpirun -np 8 --map-by slot:PE=2 --bind-to core"
  step mpi_execute 120 $mpi2 $bin/test_mpi_execute
  step mpi_random 120 $mpi2 $bin/test_mpi_random
  for ((r = 1; r <= repeats; ++r)); do
    step mpi_redistribute_two_cores.$r 240 $mpi2 $bin/bench_mpi_redistribute 10
    step mpi_redistribute.$r 240 $mpi $bin/bench_mpi_redistribute 10
    step mpi_all_to_all_paths.$r 120 $mpi $bin/bench_mpi_all_to_all_paths 10
    step mpi_batch.$r 240 $mpi $bin/bench_mpi_batch 10
  done
else
  log "no Open MPI: MPI benchmarks skipped"
fi
