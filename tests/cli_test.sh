#!/usr/bin/env bash
# dtensor-plan as a user runs it: explanations, JSON, and bad input (exit 2, one line).
set -u
tool=$1
fail=0
check() {  # description, expected exit code, command...
  local what=$1 want=$2
  shift 2
  out=$("$@" 2>/tmp/dtensor_cli_err.$$)
  got=$?
  if [ "$got" != "$want" ]; then
    echo "FAIL: $what: exit $got, expected $want"; cat /tmp/dtensor_cli_err.$$; fail=1
  fi
}
expect_in() {  # description, needle
  if ! grep -qF -- "$2" <<<"$out"; then echo "FAIL: $1: output lacks '$2'"; fail=1; fi
}

check "explain" 0 "$tool" --mesh 2x4 --shape 1024x4096 --dtype bf16 --from 'S(0),R' --to 'R,S(0)'
expect_in "explain" "exchange"
expect_in "explain" "ratio 1.00"
expect_in "explain" "0-3"
check "layout only" 0 "$tool" --mesh 4 --shape 5x3 --from 'S(0)'
expect_in "layout only" "ranks holding no elements: 3"
check "backward" 0 "$tool" --mesh 4 --shape 8x8 --from 'S(0)' --to 'R' --backward --grad P
expect_in "backward" "reduce_scatter"
check "adjoint" 0 "$tool" --mesh 4 --shape 8x8 --from 'S(0)' --to 'R' --adjoint
expect_in "adjoint" "reduce_scatter"
check "objective bytes" 0 "$tool" --mesh 4 --shape 5x2 --from 'S(0)' --to R --objective bytes
check "memory any" 0 "$tool" --mesh 2x2 --shape 8x16 --from 'S(0),S(0)' --to 'S(1),S(1)'
expect_in "memory any" "larger than both ends on some rank"
expect_in "memory any" "planned for speed, scratch unbounded"
# The default, --memory auto: bounded from 1 MiB blocks, where it costs at most 10% more time.
check "memory auto" 0 "$tool" --mesh 2x4 --shape 1024x512 --from 'S(0),R' --to 'R,S(0)' --json
expect_in "memory auto" '"blocks_within_ends":true,"memory_bounded":true'
check "memory auto slow" 0 "$tool" --mesh 2x2 --shape 1024x512 --from 'R,S(0)' --to 'S(0),R' \
  --memory auto
expect_in "memory auto slow" "planned for speed, scratch unbounded"
check "memory any large" 0 "$tool" --mesh 2x4 --shape 1024x512 --from 'S(0),R' \
  --to 'R,S(0)' --memory any --json
expect_in "memory any large" '"blocks_within_ends":false,"memory_bounded":false'
check "memory bounded" 0 "$tool" --mesh 2x2 --shape 8x16 --from 'S(0),S(0)' --to 'S(1),S(1)' \
  --memory bounded
expect_in "memory bounded" "blocks between steps within both ends; planned within the memory bound"
expect_in "memory bounded" "(within the larger of each rank's source and target blocks there)"
check "scratch in rounds" 0 "$tool" --mesh 2x4 --shape 8x16 --from 'S(0),P(sum)' \
  --to 'S(1),S(1)' --memory bounded
expect_in "scratch in rounds" "256 B on MPI and the simulator (within the larger"
# An uneven sum reduce-scatter in bf16 accumulates in float: one round, two partials staged.
check "scratch over the ends" 0 "$tool" --mesh 2x4 --shape 7x10 --dtype bf16 \
  --from 'P(max),P(sum)' --to 'R,S(1)' --memory bounded
expect_in "scratch over the ends" "224 B on MPI and the simulator (over the larger"
# In f32, and of a max, its uneven pieces are reduced in rounds into the own piece's slot.
check "sum in rounds" 0 "$tool" --mesh 2x4 --shape 7x10 --from 'P(max),P(sum)' \
  --to 'R,S(1)' --memory bounded
expect_in "sum in rounds" "280 B on MPI and the simulator (within the larger"
check "max in rounds" 0 "$tool" --mesh 2x4 --shape 7x10 --from 'P(sum),P(max)' \
  --to 'R,S(1)' --memory bounded
expect_in "max in rounds" "280 B on MPI and the simulator (within the larger"
# Planned for a backend that packs (plan_redistribute_for): the all-to-all and chunk would
# stage a piece beside the 4x16 block at the bound there; one exchange holds nothing.
check "for nccl" 0 "$tool" --mesh 2x4 --shape 8x16 --from 'S(1),R' --to 'S(0),S(0)' \
  --memory bounded --backend nccl --json
expect_in "for nccl" '"steps":[{"op":"exchange"'
expect_in "for nccl" '"scratch_within_ends_packing":true'
check "for mpi" 0 "$tool" --mesh 2x4 --shape 8x16 --from 'S(1),R' --to 'S(0),S(0)' \
  --memory bounded --backend mpi --json
expect_in "for mpi" '"steps":[{"op":"all_to_all"'
expect_in "for mpi" '"scratch_within_ends":true'
check "in place" 0 "$tool" --mesh 2x4 --shape 8x16 --from 'R,P(sum)' --to 'R,R'
expect_in "in place" "runs in place (one buffer for source and target)"
check "in place json" 0 "$tool" --mesh 2x4 --shape 8x16 --from 'R,P(sum)' --to 'R,R' --json
expect_in "in place json" '"runs_in_place":true'
check "scratch json" 0 "$tool" --mesh 2x4 --shape 8x16 --from 'R,P(sum)' --to 'S(0),S(1)' --json
expect_in "scratch json" '"workspace_bytes":256,"workspace_bytes_strided":128,"scratch_within_ends":true'
expect_in "scratch json" '"workspace_bytes":256,"workspace_bytes_strided":128}'
expect_in "scratch json" '"scratch_within_ends_packing":true'
expect_in "scratch json" '"runs_in_place":false'
check "json" 0 "$tool" --mesh 2x4 --shape 1024x4096 --dtype bf16 --from 'S(0),R' --to 'R,S(1)' --json
for key in '"mesh":[2,4]' '"shape":[1024,4096]' '"dtype":"bf16"' '"elem_bytes":2' \
           '"from":["S(0)","R"]' '"to":["R","S(1)"]' '"op":"chunk"' '"op":"all_gather","mesh_dims":[0]' \
           '"bytes_recv_max":1048576' '"lower_bound_bytes_recv_max":1048576' \
           '"src_shape":[512,4096]' '"dst_shape":[1024,1024]' '"coord":[1,3]'; do
  expect_in "json" "$key"
done
if command -v python3 >/dev/null 2>&1; then
  python3 -c 'import json,sys; d=json.load(sys.stdin); assert len(d["ranks"]) == 8' <<<"$out" ||
    { echo "FAIL: json does not parse"; fail=1; }
fi

# An empty block's offset is PyTorch's: 10 columns as (S(1),S(1)) on 2x4 leave rank 3 [7,0] at [0,10].
check "json empty block" 0 "$tool" --mesh 2x4 --shape 7x10 --from 'S(1),S(1)' --to R,R --json
expect_in "json empty block" '"rank":3,"coord":[0,3],"src_offset":[0,10],"src_shape":[7,0]'

check "relabel" 0 "$tool" --mesh 2x4 --to-mesh 4x2 --shape 8x8 --from 'S(0),S(1)' --to 'S(1),S(0)' --relabel
expect_in "relabel" "relabel ranks as [0, 4, 1, 5, 2, 6, 3, 7]"
expect_in "relabel" "moves 0 B (before: 32 B max per rank, 192 B in all)"
expect_in "relabel" "total: recv max 0 B (before 32 B), in all 0 B (before 192 B)"
check "relabel greedy" 0 "$tool" --mesh 2x4 --shape 10x6 --from 'S(0),R' --to 'R,S(0)' --relabel --relabel-method greedy
expect_in "relabel greedy" "greedy"
check "relabel json" 0 "$tool" --mesh 2x2 --shape 64x64 --from 'S(0),S(1)' --to 'S(1),S(0)' --relabel --json
for key in '"kind":"relabel"' '"method":"exact"' '"rank_for":[0,2,1,3]' '"bytes_recv_max_before":4096' \
           '"bytes_recv_total_after":0' '"moves_nothing":true'; do
  expect_in "relabel json" "$key"
done

check "batch" 0 "$tool" --mesh 2x4 --tensor '64x32:bf16:S(0),S(1):R,R' --tensor '32:f32:S(0),S(0):R,R' \
      --tensor '7x5:i64:P,R:R,R' --execute
expect_in "batch" "batch: 3 tensors on mesh 2x4"
expect_in "batch" "total: 3 collectives (one by one: 5)"
expect_in "batch" "verified"
check "batch, fewest calls" 0 "$tool" --mesh 2x4 --tensor '64x32:bf16:S(0),S(1):R,R' \
      --tensor '32:f32:S(0),S(0):R,R' --tensor '7x5:i64:P,R:R,R' --schedule fewest-calls --execute
expect_in "batch, fewest calls" "backend calls (a collective: one per group): 5; the busiest tensor alone: 6"
expect_in "batch, fewest calls" "verified"

dump=$(mktemp -d)
check "execute" 0 "$tool" --mesh 2x4 --shape 10x6 --dtype bf16 --from 'P,S(1)' --to 'R,S(0)' --execute --dump "$dump"
expect_in "execute" "verified"
for r in 0 7; do
  for kind in src dst; do
    if [ "$(head -c 6 "$dump/rank$r.$kind.npy" | tail -c 5)" != "NUMPY" ]; then
      echo "FAIL: $dump/rank$r.$kind.npy is not a .npy file"; fail=1
    fi
  done
done
rm -rf "$dump"
check "execute json" 0 "$tool" --mesh 2x2x2 --shape 5x7 --dtype i64 --from 'P(max),S(0),R' --to 'R,S(1),S(0)' --execute --json
expect_in "execute json" "verified"

for bad in "--mesh 2x0 --shape 4 --from R" "--mesh 2x4 --shape 4 --from S(0)" \
           "--mesh 2x4 --shape 4x4 --from S(2),R" "--mesh 2x4 --shape 4x4 --from X,R" \
           "--mesh 2x4 --shape 4x4 --from S(0),R --to R" "--mesh 2x4 --shape 4x4 --from R,R --dtype f8" \
           "--mesh 2x4 --from R,R" "--mesh" "--bogus 1" "--mesh 2x4 --shape 4x4 --from R,R --objective fast" \
           "--mesh 2x4 --shape 4x4 --from R,R --to R,R --memory little" \
           "--mesh 2x4 --shape 4x4 --from P(max),R --to R,R --adjoint" "positional" \
           "--mesh 2x4 --shape 4x4 --from R,R --to R,R --dump x" "--mesh 2x4 --shape 4x4 --from R,R --execute" \
           "--mesh 2x4 --shape 4x4 --from P,R --to R,R --relabel" "--mesh 2x4 --shape 4x4 --from R,R --relabel" \
           "--mesh 2x4 --shape 4x4 --from R,R --to R,R --to-mesh 4x2" \
           "--mesh 2x4 --shape 4x4 --from R,R --to R,R --relabel --to-mesh 3x3" \
           "--mesh 2x4 --shape 4x4 --from R,R --to R,R --relabel --relabel-method best" \
           "--mesh 2x4 --tensor 4x4:f32:R,R" "--mesh 2x4 --tensor 4x4:f32:R,R:R,R --shape 4x4" \
           "--mesh 2x4 --tensor 4x4:f32:R:R" "--mesh 2x4 --shape 4x4 --from R,R --schedule fused" \
           "--mesh 2x4 --tensor 4x4:f32:R,R:R,R --schedule fastest" \
           "--mesh 2x4 --shape 4x4 --from R,R --to R,R --backend gloo" \
           "--mesh 2x4 --shape 4x4 --from R,R --to R,R --backend nccl --adjoint"; do
  # shellcheck disable=SC2086
  check "bad input: $bad" 2 "$tool" $bad
  lines=$(wc -l </tmp/dtensor_cli_err.$$)
  if [ "$lines" != 1 ]; then echo "FAIL: bad input '$bad': $lines lines on stderr"; fail=1; fi
done
rm -f /tmp/dtensor_cli_err.$$
if [ $fail = 0 ]; then echo "dtensor-plan: all checks passed"; fi
exit $fail
