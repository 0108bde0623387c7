#!/usr/bin/env bash
# Whether the planner in the working tree makes the same plans as at REV (default HEAD): builds
# bench/plan_signatures against each version's headers and diffs their output over a case list
# (bench/README.md, "Same plans"). Exits 0 when every plan is the same, 1 when some differ
# (their count and the first few are printed), 2 on a usage error.
#
#   bash bench/plan_signatures.sh [REV] [CASES]
#
# CASES: one case per line in compare_plan_time's format. Default: the comparison's matrix and
# seed 004 cases (bench/compare_pytorch/cases.py), every pair of {R, S(0), S(1), P(sum), P(max)}
# on 2x2x2 at 8x16, 7x10 and 4093x8190, and 3,000 seeded random pairs on meshes of 1 to 4 dims
# up to 64 ranks (2-D and 3-D tensors, f32 and bf16). Each case is planned under four option
# sets (plan_signatures.cpp): 209,804 plans, about 20 s on this machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
rev="${1:-HEAD}"
git rev-parse --verify --quiet "$rev^{commit}" >/dev/null || {
  echo "plan_signatures.sh: '$rev' is no commit" >&2
  exit 2
}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ -n "${2:-}" ]; then
  cp "$2" "$tmp/cases"
else
  python3 - > "$tmp/cases" <<'PY'
import itertools, random, sys
sys.path.insert(0, "bench/compare_pytorch")
from cases import matrix_cases, mixed_cases
lines = [c.line() for c in matrix_cases() + mixed_cases()]
each = ["R", "S(0)", "S(1)", "P(sum)", "P(max)"]
lists = [",".join(p) for p in itertools.product(each, repeat=3)]
for shape in ["8x16", "7x10", "4093x8190"]:
    lines += [f"2x2x2 {shape} f32 {a} {b}" for a in lists for b in lists]
rng = random.Random(7)
meshes = ["2x2x2", "3x2x2", "4x4", "2x8", "16", "4x2x2", "8x8", "2x2x2x2", "3x5"]
shapes = ["8x16", "7x10", "1000x999", "4096x8192", "5x3x9"]
for _ in range(3000):
    m, s = rng.choice(meshes), rng.choice(shapes)
    ps = each + (["S(2)"] if s.count("x") == 2 else [])
    a = ",".join(rng.choice(ps) for _ in m.split("x"))
    b = ",".join(rng.choice(ps) for _ in m.split("x"))
    lines.append(f"{m} {s} {rng.choice(['f32', 'bf16'])} {a} {b}")
print("\n".join(lines))
PY
fi
mkdir -p "$tmp/rev"
git archive "$rev" include | tar -x -C "$tmp/rev"
build() {  # build HEADERS OUT
  g++ -std=c++20 -O2 -DNDEBUG -I"$1" -Ibench bench/plan_signatures.cpp -o "$2" -lfmt
}
build "$tmp/rev/include" "$tmp/at_rev" &
build include "$tmp/here"
wait $!
"$tmp/at_rev" < "$tmp/cases" > "$tmp/rev.txt" 2>/dev/null &
"$tmp/here" < "$tmp/cases" > "$tmp/here.txt" 2>/dev/null
wait $!
plans=$(wc -l < "$tmp/here.txt")
if cmp -s "$tmp/rev.txt" "$tmp/here.txt"; then
  echo "same plans: $plans plans ($(wc -l < "$tmp/cases") cases, 4 option sets) as at $rev"
  exit 0
fi
differ=$(diff "$tmp/rev.txt" "$tmp/here.txt" | grep -c '^<' || true)
echo "$differ of $plans plans differ from $rev's (< $rev, > working tree); the first:"
diff "$tmp/rev.txt" "$tmp/here.txt" | head -20
exit 1
