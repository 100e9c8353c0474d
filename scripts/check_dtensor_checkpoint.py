"""PyTorch and the safetensors library read a checkpoint dtensor wrote (tests/dist/checkpoint_interop_test.cpp).

  check_dtensor_checkpoint.py DIR
DIR holds the interop state (scripts/checkpoint_values.py) saved by dtensor from sharded layouts. Checks:
  1. safetensors.safe_open reads every file; each piece, placed at its DCP_SHARDING_INFO offsets, rebuilds
     exactly the expected tensors, every element written once;
  2. the Hugging Face index names every tensor and only files that exist;
  3. torch.distributed.checkpoint.load with HuggingFaceStorageReader (one process) loads the same values.
"""
import json
import os
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from torch.distributed.checkpoint import HuggingFaceStorageReader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_values import state  # noqa: E402

warnings.filterwarnings("ignore")


def main(directory):
    expected = state()
    rebuilt = {name: torch.zeros_like(t) for name, t in expected.items()}
    written = {name: torch.zeros(t.shape, dtype=torch.int64) for name, t in expected.items()}
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    assert files, f"no safetensors files in {directory}"
    for file in files:
        with safe_open(os.path.join(directory, file), framework="pt") as f:
            offsets = json.loads(f.metadata()["DCP_SHARDING_INFO"])
            for name in f.keys():
                piece = f.get_tensor(name)
                where = tuple(slice(o, o + s) for o, s in zip(offsets[name]["saved_offsets"], piece.shape))
                rebuilt[name][where] = piece
                written[name][where] += 1
    for name, t in expected.items():
        assert torch.equal(rebuilt[name], t), f"{name}: the pieces do not rebuild the tensor"
        assert bool((written[name] == 1).all()), f"{name}: an element is written {written[name].max()} times"
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        index = json.load(f)
    assert set(index["weight_map"]) == set(expected), "the index's weight_map does not name every tensor"
    assert set(index["weight_map"].values()) <= set(files), "the index names a file that does not exist"
    loaded = {name: torch.zeros_like(t) for name, t in expected.items()}
    dcp.load(loaded, storage_reader=HuggingFaceStorageReader(directory), no_dist=True)
    for name, t in expected.items():
        assert torch.equal(loaded[name], t), f"{name}: DCP's HuggingFaceStorageReader loads other values"
    print(f"OK: safetensors and DCP read {len(files)} files of {directory}: {len(expected)} tensors exact")


if __name__ == "__main__":
    main(sys.argv[1])
