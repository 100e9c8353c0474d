#!/usr/bin/env python3
"""PyTorch runs the per-rank programs dtensor's graph tests saved (tp_<name>_rank<r>.pt2, written by
tests/dist/graph/expect_saves.h), as they would run in a PyTorch job: WORLD ranks in their own
processes with Gloo process groups, each registered under the name the program's _c10d_functional
collectives use (from the archive's extra/dtensor.json: the mesh and its groups). Each rank loads its
program with torch.export.load, runs ep.module() on the sample inputs saved in it, and compares every
output with what dtensor's interpreter computed (tp_<name>_rank<r>.expected.pt).

    python scripts/run_saved_rank_programs.py SAVED_DIR [WORLD]
"""
import json
import os
import re
import sys
import tempfile
import zipfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers.modeling_outputs  # noqa: F401  (registers its output types with pytree: saved HF programs name them)
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils._pytree import tree_leaves


def programs(saved_dir, world):
    """The names whose programs every rank saved, with their expected outputs."""
    names = set()
    for f in os.listdir(saved_dir):
        m = re.fullmatch(r"tp_(.+)_rank0\.pt2", f)
        if m and all(os.path.exists(os.path.join(saved_dir, f"tp_{m.group(1)}_rank{r}{ext}"))
                     for r in range(world) for ext in (".pt2", ".expected.pt")):
            names.add(m.group(1))
    return sorted(names)


def mesh_of(path):
    with zipfile.ZipFile(path) as archive:
        [entry] = [n for n in archive.namelist() if n.endswith("/extra/dtensor.json")]
        return json.loads(archive.read(entry))


class Groups:
    """Gloo groups for every mesh met, made by every rank in the same order (new_group's rule), each
    registered under the names this rank's programs give its group along that dim."""

    def __init__(self):
        self.made = {}
        self.registered = set()

    def register(self, info):
        mesh = info["mesh"]
        shape, ranks, dim_names = mesh["shape"], mesh["ranks"], mesh["dim_names"]
        key = json.dumps([shape, ranks])
        grid = torch.tensor(ranks).reshape(shape)
        if key not in self.made:
            mine = []
            for dim in range(len(shape)):
                slices = grid.movedim(dim, -1).reshape(-1, shape[dim]).tolist()
                for members in slices:
                    group = dist.new_group(members)
                    if dist.get_rank() in members:
                        mine.append(group)
            self.made[key] = mine
        for name in set(info["process_groups"]) - self.registered:
            self.registered.add(name)
            label = name.rsplit("_", 1)[1]
            dim = dim_names.index(label) if label in dim_names else int(label[len("dim"):])
            torch._C._distributed_c10d._register_process_group(name, self.made[key][dim])


def run_graph(ep):
    """The program's graph on its sample inputs and its state, every output but buffer mutations (what
    dtensor's interpreter returns). The graph itself rather than ep.module(): a joint program's output
    spec is its forward's, without the gradients."""
    args, kwargs = ep.example_inputs
    user = iter(tree_leaves((args, kwargs)))
    flat = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            flat.append(next(user))
        elif spec.target in ep.state_dict:
            flat.append(ep.state_dict[spec.target])
        else:
            flat.append(ep.constants[spec.target])
    outputs = ep.graph_module(*flat)
    return [out for out, spec in zip(outputs, ep.graph_signature.output_specs) if spec.kind != OutputKind.BUFFER_MUTATION]


def rank_main(rank, world, saved_dir, store_path, failures):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    groups = Groups()
    problems = []
    names = programs(saved_dir, world)
    for name in names:
        # Every rank registers every rank's meshes (groups are made collectively), then runs its own.
        for r in range(world):
            info = mesh_of(os.path.join(saved_dir, f"tp_{name}_rank{r}.pt2"))
            if r == rank:
                groups.register(info)
            else:
                groups.register({**info, "process_groups": []})
        ep = torch.export.load(os.path.join(saved_dir, f"tp_{name}_rank{rank}.pt2"))
        got = run_graph(ep)
        expected = torch.load(os.path.join(saved_dir, f"tp_{name}_rank{rank}.expected.pt"))
        try:
            if len(got) != len(expected):
                raise AssertionError(f"{len(got)} outputs, dtensor's interpreter gave {len(expected)}")
            for k, (g, e) in enumerate(zip(got, expected)):
                torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"output {k}: {m}")
        except AssertionError as e:
            problems.append(f"{name} rank {rank}: {e}")
        dist.barrier()
    failures[rank] = problems
    print(f"rank {rank}: ran {len(names)} programs, {len(problems)} differ from dtensor's interpreter", flush=True)
    dist.destroy_process_group()


def main(saved_dir, world):
    names = programs(saved_dir, world)
    if not names:
        sys.exit(f"no per-rank programs saved by all {world} ranks in {saved_dir}")
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        failures = manager.dict()
        mp.spawn(rank_main, args=(world, saved_dir, os.path.join(tmp, "store"), failures), nprocs=world)
        problems = [p for r in range(world) for p in failures.get(r, ["rank did not report"])]
    for p in problems:
        print("FAIL:", p)
    if problems:
        sys.exit(1)
    print(f"PASS: {len(names)} per-rank programs ran in PyTorch on {world} ranks, equal to dtensor's interpreter")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4)
