#!/usr/bin/env python3
"""Fails when a lower layer of dtensor includes a higher one, or another layer's private header
(docs/architecture.md names the layers).

Every source file belongs to the layer of its directory under src/, every public header to the layer
the table below gives it (the layer whose sources implement it). A file may include headers of its own layer and of the layers it is built
on (LAYERS: each layer with the layers below it that it may use), nothing else. A public header
missing from the table is an error too, so a new one is placed on purpose. Of another layer's headers
under src/, only those in INTERNAL_DOORS may be included: the rest are that layer's own business.

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
    "pipeline": {"module", "mesh", "layout"},  # schedules as data, their runtime on a pp mesh dim (FSDP's controls)
    "graph": {"sharding", "tensor", "redistribute", "mesh", "layout", "io", "pipeline"},  # programs' stages run as pipeline stages
}

PUBLIC_HEADERS = {
    "errors.h": "layout", "pipeline_schedule.h": "pipeline", "pipeline.h": "pipeline", "pipeline_split.h": "pipeline", "placement.h": "layout", "layout.h": "layout", "pieces.h": "layout",
    "parallel_style.h": "layout",  # plans as data (placements per module path), for module and graph
    "comm_backend.h": "mesh", "comm_debug.h": "mesh", "device_mesh.h": "mesh", "launch.h": "mesh",
    "world.h": "mesh", "spec.h": "mesh", "p2p.h": "mesh",
    "redistribute_plan.h": "redistribute",
    "dtensor_impl.h": "tensor", "api.h": "tensor", "all_to_all.h": "tensor", "factory.h": "tensor", "local_map.h": "tensor",
    "visualize.h": "tensor",
    "op_schema.h": "sharding", "sharding.h": "sharding", "random.h": "sharding",
    "module.h": "module", "fsdp.h": "module", "moe.h": "module", "optim.h": "module", "parallel.h": "module", "shard_module.h": "module", "context_parallel.h": "module",
    "checkpoint.h": "checkpoint", "training_state.h": "checkpoint", "state_dict.h": "checkpoint", "dcp.h": "checkpoint",
    "graph/ir.h": "graph", "graph/annotations.h": "graph", "graph/program.h": "graph", "graph/spmd.h": "graph",
    "graph/tensor_parallel.h": "graph", "graph/hugging_face.h": "graph", "graph/training.h": "graph",
    "graph/compiled_program.h": "graph", "graph/program_stages.h": "graph", "graph/eager.h": "graph",
    "dtensor.h": None,  # the umbrella header, for users only
}

# Headers under src/ that layers above theirs may include, each with what it is for. Any other header
# under src/<layer>/ is private to that layer.
INTERNAL_DOORS = {
    "io/checked_int.h": "integers read from untrusted files",
    "io/json.h": "nlohmann with the project's warnings silenced",
    "io/untrusted_json.h": "JSON from untrusted files, checked",
    "io/json_pull.h": "untrusted JSON read without a document, for typed decoders",
    "io/restricted_pickle.h": "Python pickles from untrusted files (DCP's .metadata), executing nothing",
    "io/pickle_writer.h": "Python pickles written (DCP's .metadata)",
    "io/zip_archive.h": "zip archives (.pt2, checkpoints)",
    "mesh/collectives.h": "collectives on process groups, with timeouts naming rank and op",
    "redistribute/executor.h": "running redistribution plans, strided chunks",
    "redistribute/cross_mesh.h": "moving tensors between meshes",
    "redistribute/redistribute_log.h": "the log of what redistribution moved",
    "tensor/as_dtensor.h": "a DTensor's implementation from an at::Tensor",
    "tensor/autograd_node_ptr.h": "autograd nodes held across calls",
    "tensor/autograd_nodes.h": "DTensor's autograd functions",
    "tensor/pending_local.h": "local tensors whose collectives are in flight",
    "sharding/for_graph.h": "what graph passes ask of the rules and the cost model",
    "sharding/kernels/grouped_experts.h": "the experts of a mixture of experts with their dispatch (the MoE layer, graph programs)",
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


def is_private_to_another_layer(root, including_layer, including, name):
    """Whether `name` (a relative include) is a header under src/ of a layer other than the includer's,
    which that layer does not offer in INTERNAL_DOORS."""
    if name.startswith("dtensor/"):
        return False
    parts = (including.parent / name).resolve().relative_to(root).parts
    if parts[0] != "src" or parts[1] == including_layer:
        return False
    return "/".join(parts[1:]) not in INTERNAL_DOORS


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
            elif is_private_to_another_layer(root, layer, path, name):
                problems.append(f"{path.relative_to(root)} ({layer}) includes {name}, private to {used}: include "
                                f"what {used} offers (INTERNAL_DOORS), or offer this header there on purpose")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) break the layers (docs/architecture.md)")
        return 1
    print(f"layers hold: {len(files)} files checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
