#!/usr/bin/env python3
"""Exports the Hugging Face Llama of export_hf_models.py (GQA, 2 KV heads, small width) as a joint
forward+backward graph at several depths, for timing SPMD expansion against the layer count.

    ~/.cache/dtensor/venv-torch-2.15.0/bin/python scripts/export_llama_depths.py OUT_DIR 2 8 32

Per depth N: llama_L<N>_joint.pt2 and llama_L<N>_joint_io, as export_hf_models.export_joint writes
them (batch 4, sequence 16, Hugging Face's own causal-LM loss, checked against eager autograd); and
llama_tp_plan.json, the model's plan as transformers writes it.
"""
import json
import os
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_hf_models import FAMILIES, configure, export_joint  # noqa: E402


def main():
    out_dir, depths = sys.argv[1], [int(n) for n in sys.argv[2:]]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    for layers in depths:
        t0 = time.time()
        config = configure(transformers.LlamaConfig(**{**FAMILIES["llama"].to_dict(), "num_hidden_layers": layers}))
        export_joint(out_dir, f"llama_L{layers}", config)
        print(f"exported {layers} layers in {time.time() - t0:.1f}s", flush=True)
    plan = transformers.AutoModelForCausalLM.from_config(configure(FAMILIES["llama"])).tp_plan
    with open(os.path.join(out_dir, "llama_tp_plan.json"), "w") as f:
        json.dump(plan, f, indent=1)


if __name__ == "__main__":
    main()
