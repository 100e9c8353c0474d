#!/usr/bin/env python3
"""PyTorch reads what dtensor's graph layer writes: every .pt2 in SAVED_DIR must load with
torch.export.load (torch 2.15). Single-process programs named after a test model are also run with
ep.module() on that model's reference inputs and compared with PyTorch's reference outputs.
Per-rank tensor-parallel programs (tp_*.pt2) must show their collectives as _c10d_functional nodes;
they are not run here (that needs their process groups). Programs whose constants hold -inf (a Hugging
Face causal mask) must read -inf back, not +inf.

    python scripts/check_saved_programs.py SAVED_DIR MODELS_DIR
"""
import json
import os
import sys

import torch
import transformers.modeling_outputs  # noqa: F401  (registers its output types with pytree: saved HF programs name them)

# Reference inputs and outputs, per saved archive (see scripts/export_test_models.py).
REFERENCES = {"mlp.pt2": "mlp_io", "gpt_aten_static.pt2": "gpt_aten_static_io_b8",
              "gpt_train_ir_dynamic.pt2": "gpt_train_ir_dynamic_io_b3"}
# Saved archives with -inf among their nodes' constants (tests/unit/graph_interpreter_test.cpp).
MINUS_INFINITY = {"llama_aten.pt2"}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "bool": torch.bool}


def load_set(models_dir, name):
    index = json.load(open(os.path.join(models_dir, name + ".json")))
    blob = open(os.path.join(models_dir, name + ".bin"), "rb").read()
    out = {}
    for t in index["tensors"]:
        data = bytearray(blob[t["offset"]:t["offset"] + t["nbytes"]])
        out[t["name"]] = torch.frombuffer(data, dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def main(saved_dir, models_dir):
    files = sorted(f for f in os.listdir(saved_dir) if f.endswith(".pt2"))
    if not files:
        sys.exit(f"no .pt2 files in {saved_dir}")
    for name in files:
        ep = torch.export.load(os.path.join(saved_dir, name))
        targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
        collectives = [t for t in targets if "_c10d_functional" in t]
        if name.startswith("tp_"):
            if not collectives:
                sys.exit(f"{name}: a tensor-parallel program without collectives")
            print(f"ok {name}: loads, {len(targets)} nodes, {len(collectives)} collective nodes")
            continue
        if name in MINUS_INFINITY:
            args = [a for n in ep.graph.nodes if n.op == "call_function" for a in n.args]
            if not any(isinstance(a, float) and a == float("-inf") for a in args):
                sys.exit(f"{name}: its -inf constants did not survive the round trip")
            print(f"ok {name}: loads, its -inf constants read back as -inf")
            continue
        reference = REFERENCES.get(name)
        if reference is None:
            print(f"ok {name}: loads, {len(targets)} nodes")
            continue
        tensors = load_set(models_dir, reference)
        # Saved with the reference input as its sample input (graph::SaveProgramOptions::sample_inputs).
        args, kwargs = ep.example_inputs
        if len(args) != 1 or kwargs or not torch.equal(args[0], tensors["input0"]):
            sys.exit(f"{name}: its sample inputs are not the reference input")
        out = ep.module()(tensors["input0"])
        torch.testing.assert_close(out, tensors["output0"], rtol=1e-5, atol=1e-6)
        print(f"ok {name}: loads with its sample inputs and runs in PyTorch, outputs equal the reference")
    print(f"PASS: {len(files)} programs")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
