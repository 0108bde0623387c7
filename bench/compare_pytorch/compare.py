#!/usr/bin/env python3
"""dtensor side by side with PyTorch DTensor (issue 9).

For every case (mesh, shape, dtype, source placements, target placements) this compares:

* layouts: every rank's local shape and global offset, before and after (ours from
  `dtensor-plan --json`, PyTorch's from `compute_local_shape_and_global_offset`);
* values: the global tensor holds its own linear index (Partial sources: the distinct parts of
  dtensor's verify.hpp, the same on both sides); after redistribution every rank's block must
  equal its block of the global tensor (Partial targets: once its group's parts are reduced).
  Ours from `dtensor-plan --execute --dump`, PyTorch's from `DTensor.redistribute` with gloo on
  spawned processes;
* steps and bytes: our plan's steps beside the collectives PyTorch issues (recorded under
  `CommDebugMode`), bytes by the ring convention of docs/planner.md on both sides;
* planning time: PyTorch's `_gen_transform_infos_non_cached` and the cached
  `_gen_transform_infos` against our run-time `plan_redistribute` (compare_plan_time);
* execution time, for a few cases at 16 MiB per rank: `DTensor.redistribute` on gloo against
  `execute(plan, MpiBackend)` under mpirun (compare_mpi_execute), same processes, same bytes.

It prints one table and writes it as Markdown and CSV. run.sh sets everything up; see README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import functools
import itertools
import json
import logging
import math
import os
import pickle
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cases import (Case, matrix_cases, mixed_cases, smoke_cases,
                   timing_cases)


# ---------------------------------------------------------------------------------------------
# The global view, shared by both sides.

def partial_part(x: np.ndarray, op: str, c: int, g: int) -> np.ndarray:
    """Part c of g parts of x that reduce to x under op (dtensor's detail::partial_part for
    signed and floating-point types, the only ones the cases use)."""
    if op == "sum":
        return np.full_like(x, c + 1) if c < g - 1 else x - (g - 1) * g // 2
    if op == "avg":
        return x + (c + 1) if c < g - 1 else x - (g - 1) * g // 2
    if op == "max":
        return x if c == 0 else x - (c + 1)
    if op == "min":
        return x if c == 0 else x + (c + 1)
    if op == "product":
        return x if c == 0 else np.ones_like(x)
    raise ValueError(op)


def reduce_op(placement: str) -> str | None:
    """'P' and 'P(sum)' -> 'sum', 'P(max)' -> 'max'; None for a non-Partial placement."""
    if not placement.startswith("P"):
        return None
    return placement[2:-1] if "(" in placement else "sum"


# Where the global view wraps, as dtensor's verify.hpp (global_view_value) wraps it: values the
# dtype and the partial parts made from them hold exactly.
GLOBAL_VIEW_PERIOD = {"u8": 64, "bf16": 128, "f16": 1024, "f32": 2 ** 23,
                      "i32": (2 ** 31 - 1) // 2, "i64": (2 ** 63 - 1) // 2}


def global_block(shape, offset, local_shape, dtype) -> np.ndarray:
    """The block of the global tensor holding its own linear index (wrapped as dtensor's
    global view wraps it for `dtype`), as float64."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    ranges = [(o + np.arange(n, dtype=np.float64)) * s
              for o, n, s in zip(offset, local_shape, strides)]
    x = functools.reduce(np.add.outer, ranges)
    period = GLOBAL_VIEW_PERIOD.get(dtype)
    return np.mod(x, period) if period else x


def source_block(case: Case, coord, offset, local_shape) -> np.ndarray:
    """A rank's source block: Partial mesh dims split each value, innermost first."""
    x = global_block(case.shape, offset, local_shape, case.dtype)
    for k in reversed(range(len(case.mesh))):
        op = reduce_op(case.src[k])
        if op is not None:
            x = partial_part(x, op, coord[k], case.mesh[k])
    return x


def combine(parts: np.ndarray, op: str) -> np.ndarray:
    """Reduces axis 0 of parts under op."""
    if op in ("sum", "avg"):
        total = parts.sum(axis=0)
        return total / parts.shape[0] if op == "avg" else total
    return {"max": parts.max, "min": parts.min, "product": parts.prod}[op](axis=0)


def reduced_blocks(case: Case, coords, blocks) -> dict:
    """{rank: value} for one rank per target group (ranks that differ only on the target's
    Partial mesh dims), its group's parts reduced outermost Partial dim first; every rank's own
    block when the target has no Partial."""
    partial_dims = [k for k, p in enumerate(case.dst) if reduce_op(p)]
    if not partial_dims:
        return dict(enumerate(blocks))
    out = {}
    for rank, coord in enumerate(coords):
        if any(coord[k] != 0 for k in partial_dims):
            continue
        members = []  # ranks of the group, in row-major order of their Partial coordinates
        for sub in itertools.product(*(range(case.mesh[k]) for k in partial_dims)):
            c = list(coord)
            for k, j in zip(partial_dims, sub):
                c[k] = j
            members.append(coords.index(tuple(c)))
        parts = np.stack([blocks[m] for m in members]).reshape(
            [case.mesh[k] for k in partial_dims] + list(blocks[rank].shape))
        for k in partial_dims:  # the outermost remaining Partial dim is always axis 0
            parts = combine(parts, reduce_op(case.dst[k]))
        out[rank] = parts
    return out


def tolerance(dtype: str) -> float:
    return {"bf16": 1e-2, "f16": 1e-2, "f32": 1e-6, "f64": 1e-12}.get(dtype, 0.0)


def matches(got: np.ndarray, want: np.ndarray, dtype: str) -> bool:
    if got.shape != want.shape:
        return False
    return bool(np.all(np.abs(got - want) <= tolerance(dtype) * np.maximum(np.abs(want), 1.0)))


# ---------------------------------------------------------------------------------------------
# Our side.

def run_ours(case: Case, plan_tool: Path, dump: Path) -> dict:
    """dtensor-plan --json --execute --dump: the plan, the layouts and every rank's blocks."""
    shutil.rmtree(dump, ignore_errors=True)  # no file of an earlier case is read by mistake
    proc = subprocess.run(
        [str(plan_tool), *case.args(), "--json", "--execute", "--dump", str(dump)],
        capture_output=True, text=True)
    if proc.returncode not in (0, 1) or not dump.exists():  # refused, or the run itself failed
        return {"error": proc.stderr.strip()}
    plan = json.loads(proc.stdout.splitlines()[0])
    plan["simulator_verified"] = proc.returncode == 0
    for r in plan["ranks"]:
        r["src"] = np.load(dump / f"rank{r['rank']}.src.npy").astype(np.float64)
        r["dst"] = np.load(dump / f"rank{r['rank']}.dst.npy").astype(np.float64)
    # The same under the bytes objective, checked on the simulator only.
    proc = subprocess.run([str(plan_tool), *case.args(), "--objective", "bytes", "--json",
                           "--execute"], capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        return {"error": "--objective bytes: " + proc.stderr.strip()}
    plan["by_bytes"] = json.loads(proc.stdout.splitlines()[0])
    plan["by_bytes"]["simulator_verified"] = proc.returncode == 0
    return plan


OUR_STEP_NAMES = {"all_gather": "AG", "reduce_scatter": "RS", "all_reduce": "AR",
                  "all_to_all": "A2A", "exchange": "X", "chunk": "chunk", "scale": "scale",
                  "fill": "fill", "identity": "id"}


def our_steps(plan: dict) -> tuple[int, str]:
    """(communication steps, every step spelled like 'AG1 chunk1' with its mesh dim)."""
    names, comm = [], 0
    for s in plan["steps"]:
        name = OUR_STEP_NAMES.get(s["op"], s["op"])
        comm += name in ("AG", "RS", "AR", "A2A", "X")
        names.append(name if name == "X" else name + "".join(map(str, s["mesh_dims"])))
    return comm, " ".join(names) or "—"


def time_our_planning(cases: list[Case], tool: Path) -> list[float | None]:
    """Nanoseconds per plan_redistribute call, per case (None where dtensor refuses it)."""
    out = subprocess.run([str(tool)], input="\n".join(c.line() for c in cases) + "\n",
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return [None if line == "error" else float(line.split()[0]) for line in out if line]


def time_our_execution(cases: list[Case], tool: Path, runs: int) -> list[float]:
    """Median seconds (slowest rank) of execute(plan, MpiBackend) per case, under mpirun."""
    times = {}
    for world in sorted({c.world for c in cases}):
        group = [c for c in cases if c.world == world]
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write("".join(c.line(dtype=False) + "\n" for c in group))
            f.flush()
            flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.getuid() == 0 else [])
            out = subprocess.run(
                ["mpirun", "-np", str(world), *flags, str(tool), f.name, str(runs)],
                capture_output=True, text=True, check=True).stdout
        seconds = [float(line.split()[0]) for line in out.splitlines() if line.strip()]
        times.update(zip(group, seconds))
    return [times[c] for c in cases]


# ---------------------------------------------------------------------------------------------
# PyTorch's side: one process group per world size, every case of that size inside it.

def torch_placement(p: str):
    from torch.distributed.tensor import Partial, Replicate, Shard
    if p == "R":
        return Replicate()
    if p.startswith("S("):
        return Shard(int(p[2:-1]))
    return Partial(reduce_op(p))


TORCH_DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16",
                "i32": "int32", "i64": "int64", "u8": "uint8"}


def make_recorder(group_labels: dict):
    """A CommDebugMode that also keeps every collective's tensor sizes, so its bytes can be
    counted by the ring convention; group_labels maps a process group's name to a label
    (its mesh dim)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group
    from torch.distributed.tensor.debug import CommDebugMode

    class CollectiveRecorder(CommDebugMode):
        def __init__(self):
            super().__init__()
            self.collectives = []
            # Set while DTensor's shard_dim_alltoall runs: on CPU it falls back to all-gather.
            self.in_all_to_all = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if out is not NotImplemented and func._overloadpacket in self.comm_registry:
                self.collectives.append(self.describe(func, args, out))
            return out

        def describe(self, func, args, out) -> dict:
            """The collective's name, label and the bytes this rank receives (ring convention),
            also as the all-to-all it stands for when it is the CPU fallback."""
            name = func._overloadpacket.__name__
            group_name = next(a for a in reversed(args) if isinstance(a, str))
            group = _resolve_process_group(group_name)
            g, me = group.size(), dist.get_rank(group)
            sent = args[0].numel() * args[0].element_size()
            if name == "all_gather_into_tensor":
                kind, recv = "AG", (g - 1) * sent
            elif name == "reduce_scatter_tensor":
                kind, recv = "RS", (g - 1) * sent // g
            elif name == "all_reduce":
                # Ring: a reduce-scatter of the block in g balanced pieces, then an all-gather;
                # this rank receives every piece but its own once, and its own g - 1 times.
                n, elem = args[0].numel(), args[0].element_size()
                piece = n // g + (me < n % g)
                kind, recv = "AR", ((g - 1) * piece + n - piece) * elem
            elif name == "all_to_all_single":
                splits = args[1]
                row = out.numel() * out.element_size() // max(out.shape[0], 1)
                own = splits[me] * row if splits else out.numel() * out.element_size() // g
                kind, recv = "A2A", out.numel() * out.element_size() - own
            else:
                kind, recv = name, out.numel() * out.element_size()
            label = group_labels.get(group_name, "flat")
            intended = (g - 1) * sent // g if self.in_all_to_all else recv
            return {"kind": kind, "label": f"{kind}{label}", "recv": recv,
                    "recv_intended": intended, "fallback": self.in_all_to_all}

    # Mark the all-gathers DTensor issues in place of an all-to-all on CPU.
    import torch.distributed.tensor.placement_types as placement_types
    original = placement_types.shard_dim_alltoall
    recorder = CollectiveRecorder()

    def marked_all_to_all(*args, **kwargs):
        recorder.in_all_to_all = True
        try:
            return original(*args, **kwargs)
        finally:
            recorder.in_all_to_all = False

    placement_types.shard_dim_alltoall = marked_all_to_all
    return recorder, lambda: setattr(placement_types, "shard_dim_alltoall", original)


def torch_check_case(case: Case, mesh, group_labels: dict) -> dict:
    """Redistributes the global view with DTensor on this rank and records what happened."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._redistribute import redistribute_local_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    src = [torch_placement(p) for p in case.src]
    dst = [torch_placement(p) for p in case.dst]
    dtype = getattr(torch, TORCH_DTYPES[case.dtype])
    coord = tuple(mesh.get_coordinate())
    src_shape, src_offset = compute_local_shape_and_global_offset(case.shape, mesh, src)
    dst_shape, dst_offset = compute_local_shape_and_global_offset(case.shape, mesh, dst)
    local = torch.from_numpy(source_block(case, coord, src_offset, src_shape)).to(dtype)
    stride = tuple(math.prod(case.shape[d + 1:]) for d in range(len(case.shape)))
    record = {"coord": coord, "src_shape": tuple(src_shape), "src_offset": tuple(src_offset),
              "dst_shape": tuple(dst_shape), "dst_offset": tuple(dst_offset),
              "src": local.double().numpy(), "path": None, "error": None, "refused": None}
    def redistribute(recorder, planner):
        """The result of DTensor's redistribute under `planner` (a context manager), through
        the public API or, where it refuses, the internal one; and which path ran."""
        d = DTensor.from_local(local, mesh, src, run_check=False, shape=torch.Size(case.shape),
                               stride=stride)
        try:
            with planner(), recorder:
                return d.redistribute(mesh, dst).to_local(), "public", None
        except Exception as e:  # the public API refuses conversions to Partial but S -> P(sum)
            refused = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            recorder.collectives.clear()
            spec = d._spec
            target = DTensorSpec(mesh, tuple(dst), tensor_meta=spec.tensor_meta)
            with planner(), recorder:
                return (redistribute_local_tensor(d._local_tensor, spec, target), "internal",
                        refused)

    recorder, restore = make_recorder(group_labels)
    try:
        result, record["path"], record["refused"] = redistribute(recorder, contextlib.nullcontext)
        record["result"] = result.double().numpy()
        record["result_dtype"] = str(result.dtype).removeprefix("torch.")
        record["result_shape"] = tuple(result.shape)
    except Exception as e:
        record["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        restore()
    record["collectives"] = recorder.collectives

    # The same with PyTorch's opt-in graph search (use_min_cost_redistribution_plan), where the
    # installed version has it; its plans are cached apart only by the flag, so the cache is
    # cleared around it.
    import torch.distributed.tensor._redistribute as redistribute_module
    min_cost = getattr(redistribute_module, "use_min_cost_redistribution_plan", None)
    record["min_cost"] = None
    if min_cost is not None and record["error"] is None:
        recorder, restore = make_recorder(group_labels)
        entry = {"error": None}
        try:
            redistribute_module._gen_transform_infos.cache_clear()
            result, _, _ = redistribute(recorder, min_cost)
            entry["result"] = result.double().numpy()
            entry["result_shape"] = tuple(result.shape)
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        finally:
            restore()
            redistribute_module._gen_transform_infos.cache_clear()
        entry["collectives"] = recorder.collectives
        record["min_cost"] = entry
    return record


def time_torch_planning(case: Case, mesh) -> dict:
    """Microseconds per call of PyTorch's planner: uncached, cached, and the optimize pass that
    redistribute runs on every call."""
    import torch
    import torch.distributed.tensor._redistribute as redistribute
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    dtype = getattr(torch, TORCH_DTYPES[case.dtype])
    stride = tuple(math.prod(case.shape[d + 1:]) for d in range(len(case.shape)))
    meta = TensorMeta(torch.Size(case.shape), stride, dtype)
    src = tuple(torch_placement(p) for p in case.src)
    dst = tuple(torch_placement(p) for p in case.dst)
    src_spec = DTensorSpec(mesh, src, tensor_meta=meta)
    dst_spec = DTensorSpec(mesh, dst, tensor_meta=meta)

    def per_call_us(f) -> float:
        """Microseconds per call: the fastest of 5 batches of at least 1 ms (on a shared
        machine, slower batches measure other processes, as timeit's documentation says)."""
        calls = 1
        while True:
            start = time.perf_counter()
            for _ in range(calls):
                f()
            if time.perf_counter() - start >= 1e-3:
                break
            calls *= 2
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                f()
            samples.append((time.perf_counter() - start) / calls * 1e6)
        return min(samples)

    try:
        infos = redistribute._gen_transform_infos_non_cached(src_spec, dst_spec)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    redistribute._gen_transform_infos(src_spec, dst_spec)  # fills the cache
    times = {
        "uncached_us": per_call_us(
            lambda: redistribute._gen_transform_infos_non_cached(src_spec, dst_spec)),
        "cached_us": per_call_us(lambda: redistribute._gen_transform_infos(src_spec, dst_spec)),
        "optimize_us": per_call_us(
            lambda: redistribute._optimize_transform_infos(infos, mesh, src, dst)),
        "transform_infos": len(infos),
        "graph_uncached_us": None,
    }
    # The opt-in graph search (use_min_cost_redistribution_plan), uncached.
    try:
        redistribute._gen_transform_infos_non_cached(src_spec, dst_spec,
                                                     use_graph_based_transform=True)
        times["graph_uncached_us"] = per_call_us(
            lambda: redistribute._gen_transform_infos_non_cached(
                src_spec, dst_spec, use_graph_based_transform=True))
    except Exception:  # an older PyTorch, or a pair its search refuses
        pass
    return times


def time_torch_execution(case: Case, mesh, runs: int) -> float:
    """Median over runs (after one warm-up) of the slowest rank's seconds for redistribute."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    src = [torch_placement(p) for p in case.src]
    dst = [torch_placement(p) for p in case.dst]
    local_shape, _ = compute_local_shape_and_global_offset(case.shape, mesh, src)
    stride = tuple(math.prod(case.shape[d + 1:]) for d in range(len(case.shape)))
    d = DTensor.from_local(torch.ones(local_shape, dtype=torch.float32), mesh, src, run_check=False,
                           shape=torch.Size(case.shape), stride=stride)
    d.redistribute(mesh, dst).to_local()
    samples = []
    for _ in range(runs):
        dist.barrier()
        start = time.perf_counter()
        d.redistribute(mesh, dst).to_local()
        slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        samples.append(slowest.item())
    return statistics.median(samples)


def torch_worker(rank: int, world: int, port: int, cases: list[Case], runs: int, out_dir: str):
    """One spawned process of the gloo group: checks every case, rank 0 times PyTorch's
    planning (the others wait), then every timed case is timed end to end."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)  # as many processes as cores or more; MPI ranks are single-threaded
    # DTensor warns of its CPU all-to-all fallback and of unflattened meshes: the table shows both.
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    meshes, group_labels = {}, {}
    for shape in sorted({c.mesh for c in cases}):  # every rank creates them in the same order
        meshes[shape] = init_device_mesh("cpu", shape)
        for k in range(len(shape)):
            group_labels[meshes[shape].get_group(k).group_name] = str(k)
    checks = []
    for case in cases:
        checks.append(torch_check_case(case, meshes[case.mesh], group_labels))
        dist.barrier()
    planning = [time_torch_planning(c, meshes[c.mesh]) for c in cases] if rank == 0 else None
    dist.barrier()
    timing = {c: time_torch_execution(c, meshes[c.mesh], runs) for c in cases if c.timed}
    with open(Path(out_dir) / f"rank{rank}.pkl", "wb") as f:
        pickle.dump({"checks": checks, "planning": planning, "timing": timing}, f)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(cases: list[Case], runs: int) -> tuple[dict, dict, dict]:
    """Runs every case on PyTorch: per case, the per-rank records, the planning times and the
    execution time."""
    import torch.multiprocessing as mp

    checks, planning, timing = {}, {}, {}
    for world in sorted({c.world for c in cases}):
        group = [c for c in cases if c.world == world]
        with tempfile.TemporaryDirectory() as out_dir:
            mp.spawn(torch_worker, args=(world, free_port(), group, runs, out_dir), nprocs=world)
            per_rank = []
            for r in range(world):
                with open(Path(out_dir) / f"rank{r}.pkl", "rb") as f:
                    per_rank.append(pickle.load(f))
        for i, c in enumerate(group):
            checks[c] = [per_rank[r]["checks"][i] for r in range(world)]
            planning[c] = per_rank[0]["planning"][i]
        timing.update(per_rank[0]["timing"])
    return checks, planning, timing


# ---------------------------------------------------------------------------------------------
# Comparison.

def collective_steps(collectives: list[dict]) -> str:
    """The labels of one rank's recorded collectives (`*`: a CPU fallback), or a dash."""
    return " ".join(c["label"] + ("*" if c["fallback"] else "") for c in collectives) or "—"


def most_received(per_rank: list[list[dict]], key: str = "recv_intended") -> int:
    """The most bytes any rank received over its recorded collectives."""
    return max(sum(c[key] for c in collectives) for collectives in per_rank)


def compare_case(case: Case, ours: dict, theirs: list[dict]) -> dict:
    """The row of one case: layouts, values, steps and bytes of both sides."""
    row = {"case": case.name()}
    if "error" in ours:
        row.update(verdict="ours failed", note=ours["error"])
        return row
    comm, steps = our_steps(ours)
    row.update(ours_steps=steps, ours_comm=comm, ours_bytes=ours["bytes_recv_max"],
               bound=ours["lower_bound_bytes_recv_max"],
               ours_bytes_objective_bytes=ours["by_bytes"]["bytes_recv_max"],
               ours_bytes_objective_steps=our_steps(ours["by_bytes"])[1])
    verified = ours["simulator_verified"] and ours["by_bytes"]["simulator_verified"]
    row["ours_verified"] = "yes" if verified else "no"
    if row["ours_verified"] == "no":
        row["note"] = "dtensor-plan --execute: not verified on the simulator"
    errors = {t["error"] for t in theirs if t["error"]}
    if errors:
        row.update(verdict="torch refuses", values_equal="n/a",
                   note="; ".join(filter(None, [row.get("note"), sorted(errors)[0]])))
        return row
    coll = theirs[0]["collectives"]
    row.update(
        torch_path=theirs[0]["path"],
        torch_steps=collective_steps(coll),
        torch_comm=len(coll),
        torch_bytes=most_received([t["collectives"] for t in theirs]),
        torch_bytes_gloo=most_received([t["collectives"] for t in theirs], "recv"),
    )
    notes = [row["note"]] if row.get("note") else []
    if theirs[0]["refused"]:
        notes.append("public API refuses (" + theirs[0]["refused"] + "); internal path used")

    # Layouts: coordinates, and every rank's source and target block. An empty block's offset
    # is a convention (PyTorch puts it at the end of the global dim, dtensor where the piece
    # would start): a difference there alone is reported apart and leaves the values compared.
    def block(shape, offset):
        return tuple(shape), (tuple(offset) if math.prod(shape) else None)

    strict = layout_ok = True
    for r, (o, t) in enumerate(zip(ours["ranks"], theirs)):
        ours_blocks = [(o["src_shape"], o["src_offset"]), (o["dst_shape"], o["dst_offset"])]
        torch_blocks = [(t["src_shape"], t["src_offset"]), (t["dst_shape"], t["dst_offset"])]
        same = tuple(o["coord"]) == t["coord"] and t["result_shape"] == t["dst_shape"]
        ok = same and [block(*b) for b in ours_blocks] == [block(*b) for b in torch_blocks]
        exact = same and [tuple(map(tuple, b)) for b in ours_blocks] == \
            [tuple(map(tuple, b)) for b in torch_blocks]
        if not exact and strict:
            notes.append(f"rank {r}: ours src {o['src_offset']}+{o['src_shape']} dst "
                         f"{o['dst_offset']}+{o['dst_shape']}; torch src {t['src_offset']}+"
                         f"{t['src_shape']} dst {t['dst_offset']}+{t['dst_shape']} result "
                         f"{t['result_shape']}")
        layout_ok &= ok
        strict &= exact
    row["layout_equal"] = "yes" if strict else "empty-block offsets differ" if layout_ok else "no"

    # Values: both sides start from the same source blocks, and end with the target's blocks of
    # the global view (Partial targets: reduced over their groups).
    if not all(np.array_equal(o["src"], t["src"]) for o, t in zip(ours["ranks"], theirs)):
        notes.append("source blocks differ")
    coords = [t["coord"] for t in theirs]

    def global_view_values(blocks) -> bool:
        """Whether every rank's result block (Partial targets: reduced over each group) equals
        its target block of the global view."""
        try:
            reduced = reduced_blocks(case, coords, blocks)
        except ValueError:  # blocks of different shapes in one group
            return False
        return all(
            matches(v, global_block(case.shape, ours["ranks"][r]["dst_offset"],
                                    ours["ranks"][r]["dst_shape"], case.dtype), case.dtype)
            for r, v in reduced.items())

    verdicts = {"ours": global_view_values([o["dst"] for o in ours["ranks"]]),
                "torch": global_view_values([t["result"] for t in theirs])}
    if any(reduce_op(p) for p in case.dst):
        parts_equal = all(np.array_equal(o["dst"], t["result"])
                          for o, t in zip(ours["ranks"], theirs))
        row["partial_parts_equal"] = "yes" if parts_equal else "no"
    # PyTorch's graph search: its bytes, and its values against the global view.
    searched = [t.get("min_cost") for t in theirs]
    if all(m is not None for m in searched):
        if any(m["error"] for m in searched):
            row["torch_min_cost_values_equal"] = "error"
            notes.append("torch min-cost: " + next(m["error"] for m in searched if m["error"]))
        else:
            row.update(torch_min_cost_steps=collective_steps(searched[0]["collectives"]),
                       torch_min_cost_bytes=most_received([m["collectives"] for m in searched]))
            good = global_view_values([m["result"] for m in searched])
            row["torch_min_cost_values_equal"] = "yes" if good else "no"
            if not good:
                notes.append("torch min-cost: values differ from the global view")
    dtypes = {t["result_dtype"] for t in theirs}
    same_dtype = dtypes == {TORCH_DTYPES[case.dtype]}
    if not same_dtype:
        notes.append(f"torch's result dtype is {', '.join(sorted(dtypes))}")
    for side in ("ours", "torch"):
        if not verdicts[side]:
            notes.append(f"{side}: values differ from the global view")
    row["values_equal"] = "yes" if layout_ok and all(verdicts.values()) else "no"
    row["verdict"] = "equal" if row["values_equal"] == "yes" and same_dtype else "differs"
    row["note"] = "; ".join(notes)
    return row


COLUMNS = [  # (CSV key, Markdown header)
    ("case", "case"),
    ("ours_steps", "steps ours"),
    ("torch_steps", "collectives torch"),
    ("ours_bytes", "bytes ours"),
    ("ours_bytes_objective_bytes", "bytes ours, objective bytes"),
    ("torch_bytes", "bytes torch"),
    ("torch_min_cost_bytes", "bytes torch, min-cost"),
    ("bound", "lower bound"),
    ("plan_speedup_uncached", "plan ×, uncached"),
    ("plan_speedup_cached", "plan ×, cached"),
    ("run_ratio", "run ours/torch"),
    ("values_equal", "values equal"),
    ("note", "note"),
]
CSV_ONLY = ["ours_verified", "ours_bytes_objective_steps", "ours_comm", "torch_comm",
            "torch_bytes_gloo", "torch_path", "layout_equal", "partial_parts_equal", "verdict",
            "ours_plan_ns", "torch_uncached_us", "torch_cached_us", "torch_optimize_us",
            "torch_transform_infos", "ours_run_s", "torch_run_s", "torch_min_cost_steps",
            "torch_min_cost_values_equal", "torch_graph_uncached_us", "plan_speedup_graph"]


def fmt(value) -> str:
    """A cell: floats to 3 significant digits below 10, whole numbers above."""
    if value is None or value == "":
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if value < 10 else f"{value:.0f}"
    return str(value)


def summarize(rows: list[dict]) -> list[str]:
    """The summary figures against issue 9's targets."""
    ran = [r for r in rows if r.get("values_equal") in ("yes", "no")]
    equal = [r for r in ran if r["values_equal"] == "yes"]
    can_beat = [r for r in ran if r["bound"] < r["torch_bytes"]]
    lines = [
        f"cases: {len(rows)}; run by both: {len(ran)}; dtensor fails: "
        f"{sum(r.get('verdict') == 'ours failed' for r in rows)}; PyTorch refuses: "
        f"{sum(r.get('verdict') == 'torch refuses' for r in rows)}; "
        f"through PyTorch's internal path (public API refuses): "
        f"{sum(r.get('torch_path') == 'internal' for r in ran)}",
        f"layouts and values equal: {len(equal)} of {len(ran)} (of which "
        f"{sum(r['layout_equal'] != 'yes' for r in equal)} differ only in the offsets of empty "
        f"blocks); ours verified on the simulator (both objectives): "
        f"{sum(r.get('ours_verified') == 'yes' for r in rows)} of {len(rows)}",
    ]
    for key, label in [("ours_bytes", "default objective (time)"),
                       ("ours_bytes_objective_bytes", "objective bytes")]:
        leq = [r for r in ran if r[key] <= r["torch_bytes"]]
        beat = [r for r in can_beat if r[key] < r["torch_bytes"]]
        missed = [r for r in can_beat if r[key] >= r["torch_bytes"]]
        partial_src = sum("P" in r["case"].split(" → ")[0].split()[-1] for r in missed)
        lines.append(f"bytes ours <= torch, {label}: {len(leq)} of {len(ran)}; strictly fewer "
                     f"where the lower bound is below torch's: {len(beat)} of {len(can_beat)} "
                     f"(of the {len(missed)} others, {partial_src} have a Partial source)")

    searched = [r for r in ran if r.get("torch_min_cost_bytes") is not None]
    if searched:
        fewer = [r for r in searched if r["torch_min_cost_bytes"] < r["torch_bytes"]]
        more = [r for r in searched if r["torch_min_cost_bytes"] > r["torch_bytes"]]
        line = (f"PyTorch's graph search (use_min_cost_redistribution_plan): {len(searched)} "
                f"cases, values equal on "
                f"{sum(r['torch_min_cost_values_equal'] == 'yes' for r in searched)}; fewer "
                f"bytes than its greedy plan on {len(fewer)}, more on {len(more)}")
        for key, label in [("ours_bytes", "default objective"),
                           ("ours_bytes_objective_bytes", "objective bytes")]:
            leq = sum(r[key] <= r["torch_min_cost_bytes"] for r in searched)
            lt = sum(r[key] < r["torch_min_cost_bytes"] for r in searched)
            line += f"; ours <= it ({label}): {leq}, strictly fewer: {lt}"
        lines.append(line)
        errors = sum(r.get("torch_min_cost_values_equal") == "error" for r in ran)
        if errors:
            lines.append(f"PyTorch's graph search fails on {errors} cases its greedy plan runs")

    def spread(values, unit):
        return (f"min {fmt(min(values))}{unit}, median {fmt(statistics.median(values))}{unit}, "
                f"max {fmt(max(values))}{unit}")

    planned = [r for r in ran if r.get("plan_speedup_uncached")]
    if planned:
        lines += [
            f"our plan_redistribute: {spread([r['ours_plan_ns'] / 1e3 for r in planned], ' µs')}",
            f"planning speed-up over PyTorch, uncached: "
            f"{spread([r['plan_speedup_uncached'] for r in planned], '×')}; "
            f"≥ 100×: {sum(r['plan_speedup_uncached'] >= 100 for r in planned)} of "
            f"{len(planned)}",
            f"planning speed-up over PyTorch, cached: "
            f"{spread([r['plan_speedup_cached'] for r in planned], '×')}",
            f"PyTorch's _optimize_transform_infos, run on every redistribute after the cached "
            f"lookup: {spread([r['torch_optimize_us'] for r in planned], ' µs')}",
        ]
        graph = [r for r in planned if r.get("plan_speedup_graph")]
        if graph:
            lines.append(
                f"planning speed-up over PyTorch's graph search, uncached: "
                f"{spread([r['plan_speedup_graph'] for r in graph], '×')}; ≥ 100×: "
                f"{sum(r['plan_speedup_graph'] >= 100 for r in graph)} of {len(graph)}")
    for r in rows:
        if r.get("run_ratio"):
            lines.append(f"execution at 16 MiB per rank, ours/torch: {r['run_ratio']:.2f} "
                         f"({r['ours_run_s'] * 1e3:.1f} ms / {r['torch_run_s'] * 1e3:.1f} ms)  "
                         f"{r['case']}")
    return lines


def write_outputs(rows: list[dict], summary: list[str], md: Path, header: str):
    """The table and the summary as Markdown at md, the table as CSV beside it."""
    md.parent.mkdir(parents=True, exist_ok=True)
    with open(md.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k, _ in COLUMNS] + CSV_ONLY, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: fmt(r.get(k)) for k in w.fieldnames})
    lines = [header, "", "| " + " | ".join(h for _, h in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = (fmt(r.get(k)).replace("|", "\\|") for k, _ in COLUMNS)
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *[f"- {s}" for s in summary], ""]
    md.write_text("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, required=True,
                        help="CMake build dir holding dtensor-plan and this folder's drivers")
    parser.add_argument("--out", type=Path, required=True,
                        help="where compare.md and compare.csv go (smoke: compare-smoke.*)")
    parser.add_argument("--smoke", action="store_true", help="two cases only")
    parser.add_argument("--runs", type=int, default=None, help="timed runs per execution case")
    args = parser.parse_args()
    plan_tool = args.build / "examples" / "dtensor-plan"
    plan_time_tool = args.build / "bench" / "compare_plan_time"
    mpi_tool = args.build / "bench" / "compare_mpi_execute"
    cases = smoke_cases() if args.smoke else matrix_cases() + mixed_cases() + timing_cases()
    runs = args.runs or (3 if args.smoke else 7)
    started = time.time()

    print(f"{len(cases)} cases; ours: dtensor-plan --execute ...", file=sys.stderr, flush=True)
    ours = {}
    with tempfile.TemporaryDirectory() as tmp:
        for c in cases:
            ours[c] = run_ours(c, plan_tool, Path(tmp) / "dump")
    print("ours: planning time ...", file=sys.stderr, flush=True)
    plan_ns = dict(zip(cases, time_our_planning(cases, plan_time_tool)))
    print(f"PyTorch: {len(cases)} cases on gloo ...", file=sys.stderr, flush=True)
    checks, torch_planning, torch_timing = run_torch(cases, runs)
    timed = [c for c in cases if c.timed]
    print(f"ours: {len(timed)} cases under mpirun ...", file=sys.stderr, flush=True)
    our_timing = dict(zip(timed, time_our_execution(timed, mpi_tool, runs))) if timed else {}

    rows = []
    for c in cases:
        row = compare_case(c, ours[c], checks[c])
        row["ours_plan_ns"] = plan_ns[c]
        p = torch_planning[c]
        if "error" not in p and plan_ns[c]:
            row.update(torch_uncached_us=p["uncached_us"], torch_cached_us=p["cached_us"],
                       torch_optimize_us=p["optimize_us"],
                       torch_transform_infos=p["transform_infos"],
                       plan_speedup_uncached=p["uncached_us"] * 1e3 / plan_ns[c],
                       plan_speedup_cached=p["cached_us"] * 1e3 / plan_ns[c])
            if p.get("graph_uncached_us"):
                row.update(torch_graph_uncached_us=p["graph_uncached_us"],
                           plan_speedup_graph=p["graph_uncached_us"] * 1e3 / plan_ns[c])
        if c.timed:
            row.update(ours_run_s=our_timing[c], torch_run_s=torch_timing[c],
                       run_ratio=our_timing[c] / torch_timing[c])
        rows.append(row)

    import torch
    repo = Path(__file__).resolve().parents[2]
    commit = subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    header = (f"# dtensor {commit} vs PyTorch DTensor {torch.__version__} (gloo), "
              f"{'smoke' if args.smoke else 'full'} run, {datetime.date.today()}, "
              f"{os.cpu_count()} cores; execution: median of {runs} runs, slowest rank")
    summary = summarize(rows)
    md = args.out / ("compare-smoke.md" if args.smoke else "compare.md")
    write_outputs(rows, summary, md, header)
    print(header + "\n")
    widths = {k: max(len(h), *(len(fmt(r.get(k))) for r in rows))
              for k, h in COLUMNS if k != "note"}
    print("  ".join(h.ljust(widths[k]) for k, h in COLUMNS if k != "note"))
    for r in rows:
        print("  ".join(fmt(r.get(k)).ljust(widths[k]) for k, _ in COLUMNS if k != "note"))
    print()
    for s in summary:
        print(s)
    print(f"\nwrote {md} and {md.with_suffix('.csv')} "
          f"({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
