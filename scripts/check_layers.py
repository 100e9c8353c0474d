#!/usr/bin/env python3
"""Fails when a lower layer of dtensor includes a higher one (docs/architecture.md names the layers).

Every source file belongs to the layer of its directory under src/, every public header to the layer
the table below gives it (the layer whose sources implement it). A file may include headers of its own layer and of the layers it is built
on (LAYERS: each layer with the layers below it that it may use), nothing else. A public header
missing from the table is an error too, so a new one is placed on purpose.

Usage: check_layers.py [repository root]   (exit 1 and one line per offending include)
"""

import pathlib
import re
import sys

# Each layer and the layers it is built on, lowest first.
LAYERS = {
    "layout": set(),                    # placements, shard layout math, errors
    "io": {"layout"},                   # untrusted files: zip, JSON, checked integers
    "mesh": {"layout"},                 # processes, meshes, backends, collectives, the DTensor spec
    "redistribute": {"mesh", "layout"},  # plans and their execution
    "tensor": {"redistribute", "mesh", "layout"},  # DTensor as at::Tensor, its API and autograd
    "sharding": {"tensor", "redistribute", "mesh", "layout"},  # rules, propagation, dispatch
    "module": {"sharding", "tensor", "redistribute", "mesh", "layout"},  # nn modules, TP styles
    "checkpoint": {"module", "tensor", "redistribute", "mesh", "layout", "io"},
    "graph": {"sharding", "tensor", "redistribute", "mesh", "layout", "io"},
}

PUBLIC_HEADERS = {
    "errors.h": "layout", "placement.h": "layout", "layout.h": "layout", "pieces.h": "layout",
    "parallel_style.h": "layout",  # plans as data (placements per module path), for module and graph
    "comm_backend.h": "mesh", "comm_debug.h": "mesh", "device_mesh.h": "mesh", "launch.h": "mesh",
    "world.h": "mesh", "spec.h": "mesh",
    "redistribute_plan.h": "redistribute",
    "dtensor_impl.h": "tensor", "api.h": "tensor", "factory.h": "tensor", "local_map.h": "tensor",
    "visualize.h": "tensor",
    "op_schema.h": "sharding", "sharding.h": "sharding", "random.h": "sharding",
    "module.h": "module", "fsdp.h": "module", "optim.h": "module", "parallel.h": "module", "shard_module.h": "module",
    "checkpoint.h": "checkpoint", "training_state.h": "checkpoint",
    "graph/ir.h": "graph", "graph/annotations.h": "graph", "graph/program.h": "graph", "graph/spmd.h": "graph",
    "graph/tensor_parallel.h": "graph", "graph/hugging_face.h": "graph", "graph/training.h": "graph",
    "graph/compiled_program.h": "graph",
    "dtensor.h": None,  # the umbrella header, for users only
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of_header(root, including, name):
    """The layer of the header `name` included from file `including`, or None for a user-only one."""
    if name.startswith("dtensor/"):
        key = name[len("dtensor/"):]
        if key not in PUBLIC_HEADERS:
            raise KeyError(f"public header {name} has no layer in scripts/check_layers.py")
        return PUBLIC_HEADERS[key]
    target = (including.parent / name).resolve()
    return layer_of_path(root, target)


def layer_of_path(root, path):
    parts = path.relative_to(root).parts
    if parts[0] == "src":
        return parts[1]
    if parts[0] == "include":
        return PUBLIC_HEADERS["/".join(parts[2:])]
    raise KeyError(f"{path} is neither under src/ nor include/")


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    files = sorted(p for p in (root / "src").rglob("*") if p.suffix in (".h", ".cpp"))
    files += sorted((root / "include" / "dtensor").rglob("*.h"))
    problems = []
    for path in files:
        try:
            layer = layer_of_path(root, path)
        except KeyError as e:
            problems.append(str(e))
            continue
        if layer is None:
            continue
        if layer not in LAYERS:
            problems.append(f"{path.relative_to(root)}: directory src/{layer} is not a layer in scripts/check_layers.py")
            continue
        for name in INCLUDE.findall(path.read_text()):
            try:
                used = layer_of_header(root, path, name)
            except KeyError as e:
                problems.append(f"{path.relative_to(root)}: {e}")
                continue
            if used is None:
                problems.append(f"{path.relative_to(root)} ({layer}) includes {name}, which is for users only")
            elif used != layer and used not in LAYERS[layer]:
                problems.append(f"{path.relative_to(root)} ({layer}) includes {name} ({used}): {layer} is built "
                                f"on {', '.join(sorted(LAYERS[layer])) or 'nothing'}")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) break the layers (docs/architecture.md)")
        return 1
    print(f"layers hold: {len(files)} files checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
