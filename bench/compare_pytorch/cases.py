"""The cases of the side-by-side comparison (compare.py) and of the memory table
(memory_table.py): the planner's exhaustive matrix on meshes 4, 2x2 and 2x4, seed 004's mixed
cases, dtype variants and the cases timed end to end. Standard library only."""

from __future__ import annotations

import dataclasses
import itertools
import math

# The placements of the planner's exhaustive matrix (tests/planner_test.cpp).
MATRIX_PLACEMENTS = ("R", "S(0)", "S(1)", "P(sum)", "P(max)")

# Bytes per rank at which execution is timed: the larger of a rank's source and target blocks.
TIMING_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True)
class Case:
    """One redistribution, in dtensor-plan's spellings: mesh (2, 4), placements ("S(0)", "R")."""

    mesh: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    src: tuple[str, ...]
    dst: tuple[str, ...]
    timed: bool = False  # also time execution end to end on both sides

    @property
    def world(self) -> int:
        return math.prod(self.mesh)

    def args(self) -> list[str]:
        """The case as dtensor-plan arguments."""
        return ["--mesh", "x".join(map(str, self.mesh)), "--shape", "x".join(map(str, self.shape)),
                "--dtype", self.dtype, "--from", ",".join(self.src), "--to", ",".join(self.dst)]

    def line(self, dtype: bool = True) -> str:
        """The case as one line of compare_plan_time's input (compare_mpi_execute's: no dtype)."""
        return " ".join(["x".join(map(str, self.mesh)), "x".join(map(str, self.shape)),
                         *([self.dtype] if dtype else []), ",".join(self.src), ",".join(self.dst)])

    def name(self) -> str:
        return (f"{'x'.join(map(str, self.mesh))} {'x'.join(map(str, self.shape))} {self.dtype} "
                f"{','.join(self.src)} → {','.join(self.dst)}")


def timing_shape(mesh: tuple[int, ...], src: tuple[str, ...],
                 dst: tuple[str, ...]) -> tuple[int, int]:
    """A [rows, 1024] f32 shape whose larger per-rank block is TIMING_BYTES."""

    def pieces(placements):
        return math.prod(g for g, p in zip(mesh, placements) if p.startswith("S"))

    rows = TIMING_BYTES // (1024 * 4) * min(pieces(src), pieces(dst))
    return (rows, 1024)


def timed_case(mesh, src, dst) -> Case:
    return Case(mesh, timing_shape(mesh, src, dst), "f32", src, dst, timed=True)


def matrix_cases() -> list[Case]:
    """Every pair of the planner's exhaustive matrix on meshes 4, 2x2, 2x4, even and uneven."""
    cases = []
    for mesh in [(4,), (2, 2), (2, 4)]:
        layouts = list(itertools.product(MATRIX_PLACEMENTS, repeat=len(mesh)))
        for shape in [(8, 16), (7, 10)]:
            cases += [Case(mesh, shape, "f32", a, b) for a in layouts for b in layouts]
    return cases


def mixed_cases() -> list[Case]:
    """Seed 004's nested and mixed cases on a 3-D mesh (its 2-D ones, such as (S(0), S(0)) ->
    (R, S(0)) or (S(0), S(1)) -> (S(1), S(0)), are in the matrix), and other dtypes."""
    mixed = [
        ((2, 2, 2), ("P(sum)", "S(1)", "S(1)"), ("S(1)", "R", "S(1)")),
        ((2, 2, 2), ("P(sum)", "S(0)", "R"), ("R", "R", "S(0)")),
        ((2, 2, 2), ("S(0)", "S(1)", "R"), ("R", "S(0)", "S(1)")),
        ((2, 2, 2), ("P(sum)", "S(0)", "S(1)"), ("R", "S(1)", "S(0)")),
        ((2, 2, 2), ("S(0)", "S(0)", "S(0)"), ("R", "R", "R")),
        ((2, 2, 2), ("S(0)", "S(0)", "S(0)"), ("S(1)", "R", "S(0)")),
        ((2, 2, 2), ("R", "S(0)", "S(0)"), ("S(0)", "S(0)", "R")),
        ((2, 2, 2), ("S(1)", "P(sum)", "S(0)"), ("S(0)", "S(1)", "R")),
        ((2, 2, 2), ("P(max)", "P(max)", "S(1)"), ("S(0)", "R", "S(0)")),
    ]
    cases = [Case(m, shape, "f32", a, b) for m, a, b in mixed for shape in [(8, 16), (7, 10)]]
    # Other dtypes: integer and bf16 reductions, and the Partial conversions PyTorch treats
    # differently (R -> P(sum) divides; avg). Not an integer P(avg): dtensor refuses it, and
    # PyTorch's gloo all-reduce fails on it, on some ranks only at their next collective, which
    # can leave the process group hanging.
    variants = [
        ((4,), "i64", ("R",), ("P(sum)",)),
        ((4,), "i64", ("S(0)",), ("P(sum)",)),
        ((4,), "i64", ("P(sum)",), ("S(0)",)),
        ((4,), "f32", ("P(avg)",), ("R",)),
        ((4,), "f32", ("R",), ("P(avg)",)),
        ((4,), "bf16", ("P(sum)",), ("S(1)",)),
        ((2, 2), "bf16", ("P(max)", "S(0)"), ("R", "R")),
        ((2, 4), "i64", ("P(sum)", "S(1)"), ("R", "S(0)")),
    ]
    cases += [Case(m, (8, 16), t, a, b) for m, t, a, b in variants]
    return cases


def timing_cases() -> list[Case]:
    """The cases timed end to end at 16 MiB per rank: one of each kind of step, 8 processes."""
    return [
        timed_case((8,), ("S(0)",), ("R",)),  # all-gather
        timed_case((8,), ("P(sum)",), ("S(0)",)),  # reduce-scatter
        timed_case((8,), ("P(sum)",), ("R",)),  # all-reduce
        timed_case((8,), ("S(0)",), ("S(1)",)),  # all-to-all
        timed_case((2, 4), ("S(0)", "R"), ("R", "S(0)")),  # exchange
    ]


def smoke_cases() -> list[Case]:
    """Two cases on 4 processes, both timed: a reduce-scatter and an exchange."""
    return [timed_case((4,), ("P(sum)",), ("S(0)",)),
            timed_case((2, 2), ("S(0)", "R"), ("R", "S(0)"))]
