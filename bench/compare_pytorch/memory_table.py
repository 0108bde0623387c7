#!/usr/bin/env python3
"""How many of the comparison's cases hold more scratch than the larger of a rank's source and
target blocks: docs/execution.md's memory table (issue 5), from `dtensor-plan --json`'s
`scratch_within_ends` (strided backends: MPI, the simulator) and `scratch_within_ends_packing`
(backends that pack: NCCL), under both objectives, by default (`Memory::automatic`), with
`Memory::any` and with `Memory::bounded`.

    python3 bench/compare_pytorch/memory_table.py [--plan build/dev/examples/dtensor-plan]
                                                  [--list ROW] [--scale EVEN UNEVEN]

Standard library only. `--list ROW` also prints the cases over the bound in that row
(`time`, `time,any`, `bytes`, `bytes,any`, `time,bounded`, `bytes,bounded`, and `time,bounded,for
nccl` and `time,bounded,for mpi`, planned for that backend with `--backend`,
`plan_redistribute_for`; packing and strided). `--scale 4096x8192 4093x8190` runs the matrix's cases at those shapes instead of 8x16
and 7x10 (the other cases are left out): the comparison's tensors are far below the 1 MiB blocks
from which the default seeks the bound."""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import Case, matrix_cases, mixed_cases, timing_cases  # noqa: E402

ROWS = {"time": [], "time,any": ["--memory", "any"],
        "bytes": ["--objective", "bytes"], "bytes,any": ["--objective", "bytes", "--memory", "any"],
        "time,bounded": ["--memory", "bounded"],
        "bytes,bounded": ["--objective", "bytes", "--memory", "bounded"],
        "time,bounded,for nccl": ["--memory", "bounded", "--backend", "nccl"],
        "time,bounded,for mpi": ["--memory", "bounded", "--backend", "mpi"]}
BACKENDS = {"packing": "scratch_within_ends_packing", "strided": "scratch_within_ends"}


def over_bound(tool: str, case: Case, extra: list[str]) -> dict[str, bool]:
    """Whether the case's plan holds more than the bound on some rank, per kind of backend."""
    out = subprocess.run([tool, *case.args(), "--json", *extra], capture_output=True, text=True,
                         check=True).stdout
    plan = json.loads(out)
    return {b: not plan[key] for b, key in BACKENDS.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default="build/dev/examples/dtensor-plan")
    parser.add_argument("--list", choices=list(ROWS), action="append", default=[])
    parser.add_argument("--scale", nargs=2, metavar=("EVEN", "UNEVEN"))
    args = parser.parse_args()
    cases = matrix_cases() + mixed_cases() + timing_cases()
    uneven_shape = (7, 10)
    if args.scale:
        even, uneven = (tuple(int(n) for n in s.split("x")) for s in args.scale)
        scaled = {(8, 16): even, (7, 10): uneven}
        cases = [dataclasses.replace(c, shape=scaled[c.shape]) for c in cases if c.shape in scaled]
        uneven_shape = uneven
    print(f"{len(cases)} cases; plans over the larger of a rank's blocks on some rank:\n")
    print("| objective | backend | all | even | uneven |\n|---|---|---|---|---|")
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for row, extra in ROWS.items():
            results = list(pool.map(lambda c, e=extra: over_bound(args.plan, c, e), cases))
            for backend in BACKENDS:
                over = [c for c, r in zip(cases, results) if r[backend]]
                uneven = sum(1 for c in over if c.shape == uneven_shape)
                print(f"| {row} | {backend} | {len(over)} | {len(over) - uneven} | {uneven} |")
                if row in args.list:
                    for c in over:
                        print(f"    {c.name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
