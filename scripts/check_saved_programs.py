#!/usr/bin/env python3
"""PyTorch reads what dtensor's graph layer writes: every .pt2 in SAVED_DIR must load with
torch.export.load (torch 2.15). Single-process programs named after a test model are also run with
ep.module() on that model's reference inputs and compared with PyTorch's reference outputs.
Per-rank programs (tp_*.pt2) run on their ranks in scripts/run_saved_rank_programs.py. Programs whose
constants hold -inf (a Hugging Face causal mask) must read -inf back, not +inf.

    python scripts/check_saved_programs.py SAVED_DIR MODELS_DIR
"""
import concurrent.futures
import json
import multiprocessing
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


class Refused(Exception):
    """A saved program PyTorch does not read as it should."""


def check(saved_dir, models_dir, name):
    """Loads one saved program and checks it; returns the line to print, raises Refused."""
    ep = torch.export.load(os.path.join(saved_dir, name))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    if name in MINUS_INFINITY:
        args = [a for n in ep.graph.nodes if n.op == "call_function" for a in n.args]
        if not any(isinstance(a, float) and a == float("-inf") for a in args):
            raise Refused(f"{name}: its -inf constants did not survive the round trip")
        return f"ok {name}: loads, its -inf constants read back as -inf"
    reference = REFERENCES.get(name)
    if reference is None:
        return f"ok {name}: loads, {len(targets)} nodes"
    tensors = load_set(models_dir, reference)
    # Saved with the reference input as its sample input (graph::SaveProgramOptions::sample_inputs).
    args, kwargs = ep.example_inputs
    if len(args) != 1 or kwargs or not torch.equal(args[0], tensors["input0"]):
        raise Refused(f"{name}: its sample inputs are not the reference input")
    out = ep.module()(tensors["input0"])
    torch.testing.assert_close(out, tensors["output0"], rtol=1e-5, atol=1e-6)
    return f"ok {name}: loads with its sample inputs and runs in PyTorch, outputs equal the reference"


def main(saved_dir, models_dir):
    # Per-rank programs (tp_*) run on their ranks in scripts/run_saved_rank_programs.py.
    files = sorted(f for f in os.listdir(saved_dir) if f.endswith(".pt2") and not f.startswith("tp_"))
    if not files:
        sys.exit(f"no .pt2 files in {saved_dir}")
    # Two processes (forked after torch's import): loading is most of the time, one archive at a time.
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        try:
            for line in pool.map(check, [saved_dir] * len(files), [models_dir] * len(files), files):
                print(line)
        except Refused as e:
            sys.exit(str(e))
    print(f"PASS: {len(files)} programs")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
