#!/usr/bin/env bash
# Instructions per plan_redistribute call, case by case, counted by callgrind: a measure of
# planning work that does not move with this shared machine's load (bench/README.md).
#
#   bash bench/plan_instructions.sh [CASES] [OUT]
#
# CASES: one case per line in compare_plan_time's format (default: the comparison's matrix and
# seed 004 cases, 2,576, from bench/compare_pytorch/cases.py). OUT (default
# build/plan-instructions.txt): each case's line and its instructions per plan. Prints the
# median, percentiles and the sum.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${2:-build/plan-instructions.txt}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ -n "${1:-}" ]; then
  cp "$1" "$tmp/cases"
else
  python3 -c 'import sys; sys.path.insert(0, "bench/compare_pytorch")
from cases import matrix_cases, mixed_cases
print("\n".join(c.line() for c in matrix_cases() + mixed_cases()))' > "$tmp/cases"
fi
[ -f build/release/CMakeCache.txt ] || cmake --preset release >/dev/null
cmake --build --preset release --target plan_instructions >/dev/null
valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.%p" --dump-line=no \
  build/release/bench/plan_instructions < "$tmp/cases" > /dev/null 2> "$tmp/log" || {
  cat "$tmp/log" >&2
  exit 1
}
python3 - "$tmp" "$out" <<'PY'
import glob, re, sys
tmp, out = sys.argv[1], sys.argv[2]
plans = 4  # kPlans in plan_instructions.cpp
dumps = sorted((f for f in glob.glob(tmp + "/cg.*") if re.search(r"\.\d+\.\d+$", f)),
               key=lambda f: int(f.rsplit(".", 1)[1]))
counts = []
for f in dumps:
    total = next((int(l.split()[1]) for l in open(f) if l.startswith("totals:")), 0)
    counts.append(total // plans)
cases = [l.rstrip("\n") for l in open(tmp + "/cases") if l.strip()]
if len(counts) != len(cases):
    sys.exit(f"plan_instructions: {len(counts)} dumps for {len(cases)} cases")
with open(out, "w") as o:
    for c, n in zip(cases, counts):
        o.write(f"{c} {n}\n")
v = sorted(counts)
q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
print(f"{len(v)} cases: median {q(0.5)}, 90th percentile {q(0.9)}, max {v[-1]}, "
      f"sum {sum(v)} instructions per plan; per case in {out}")
PY
