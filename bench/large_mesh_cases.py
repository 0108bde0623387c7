#!/usr/bin/env python3
"""Prints 600 random redistributions on meshes of 16 to 1,024 ranks (12 meshes of 1 to 4 dims),
one per line in plan_instructions' format (MESH SHAPE DTYPE FROM TO): bf16 tensors of 2 dims
(100 to 8,192 each) or 3 (8 to 512 each), uneven extents, every placement of R, S(d), P(sum) and
P(max) on each mesh dim, Partials of two ops in one list included. Seeded: the same 600 every
run.

    python3 bench/large_mesh_cases.py > build/large-mesh-cases.txt
    bash bench/plan_instructions.sh build/large-mesh-cases.txt build/large-mesh-instructions.txt
"""

import random

MESHES = ["16", "64", "1024", "4x4", "2x8", "8x8", "16x64", "32x32", "4x4x4", "2x8x8", "8x8x16",
          "4x4x4x4"]


def placements(rng: random.Random, mesh_dims: int, tensor_dims: int) -> str:
    letters = ["R"] + [f"S({d})" for d in range(tensor_dims)] + ["P(sum)", "P(max)"]
    return ",".join(rng.choice(letters) for _ in range(mesh_dims))


def main() -> None:
    rng = random.Random(33)
    for _ in range(600):
        mesh = rng.choice(MESHES)
        mesh_dims = mesh.count("x") + 1
        tensor_dims = rng.choice([2, 3])
        if tensor_dims == 2:
            shape = [rng.randint(100, 8192), rng.randint(100, 8192)]
        else:
            shape = [rng.randint(8, 512) for _ in range(3)]
        src = placements(rng, mesh_dims, tensor_dims)
        dst = placements(rng, mesh_dims, tensor_dims)
        print(f"{mesh} {'x'.join(map(str, shape))} bf16 {src} {dst}")


if __name__ == "__main__":
    main()
