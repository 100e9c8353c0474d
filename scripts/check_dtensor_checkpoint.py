"""PyTorch and the safetensors library read a checkpoint dtensor wrote (tests/dist/checkpoint_interop_test.cpp).

  check_dtensor_checkpoint.py DIR WHOLE_DIR DCP_DIR
DIR holds the interop state (scripts/checkpoint_values.py) saved by dtensor from sharded layouts, WHOLE_DIR
the same saved with whole_tensors, DCP_DIR the same in PyTorch's DCP format (dcp::save), which
torch.distributed.checkpoint.load must read exactly. Checks, for DIR and WHOLE_DIR:
  1. safetensors.safe_open reads every file; each piece, placed at its DCP_SHARDING_INFO offsets, rebuilds
     exactly the expected tensors, every element written once;
  2. the Hugging Face index's weight_map names exactly the tensors saved whole, in files holding them;
  3. torch.distributed.checkpoint.load with HuggingFaceStorageReader (one process) loads the same values;
and in WHOLE_DIR, that the weight_map names every tensor and safetensors.torch.load_file of its files
gives the whole state (what Hugging Face's loaders do).
"""
import json
import os
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import load_file
from torch.distributed.checkpoint import HuggingFaceStorageReader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_values import state  # noqa: E402

warnings.filterwarnings("ignore")


def check(directory):
    expected = state()
    rebuilt = {name: torch.zeros_like(t) for name, t in expected.items()}
    written = {name: torch.zeros(t.shape, dtype=torch.int64) for name, t in expected.items()}
    pieces = {name: [] for name in expected}
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
                pieces[name].append(piece.shape)
    for name, t in expected.items():
        assert torch.equal(rebuilt[name], t), f"{name}: the pieces do not rebuild the tensor"
        assert bool((written[name] == 1).all()), f"{name}: an element is written {written[name].max()} times"
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        index = json.load(f)
    # Hugging Face's weight_map: every tensor saved whole (one piece), in the file that holds it.
    whole = {name for name, t in expected.items() if int(written[name].numel()) == 0 or pieces[name] == [t.shape]}
    assert set(index["weight_map"]) == whole, f"weight_map names {set(index['weight_map'])}, not the whole tensors {whole}"
    for name, file in index["weight_map"].items():
        with safe_open(os.path.join(directory, file), framework="pt") as f:
            assert torch.equal(f.get_tensor(name), expected[name]), f"weight_map: {file} does not hold all of {name}"
    assert set(index["dtensor"]["files"]) == set(files), "the index's dtensor section does not list the files"
    loaded = {name: torch.zeros_like(t) for name, t in expected.items()}
    dcp.load(loaded, storage_reader=HuggingFaceStorageReader(directory), no_dist=True)
    for name, t in expected.items():
        assert torch.equal(loaded[name], t), f"{name}: DCP's HuggingFaceStorageReader loads other values"
    print(f"OK: safetensors and DCP read {len(files)} files of {directory}: {len(expected)} tensors exact")
    return index


def check_dcp(directory):
    """PyTorch's own FileSystemReader (the default of dcp.load) reads what dcp::save wrote."""
    expected = state()
    loaded = {name: torch.zeros_like(t) for name, t in expected.items()}
    dcp.load(loaded, checkpoint_id=directory, no_dist=True)
    for name, t in expected.items():
        assert torch.equal(loaded[name], t), f"{name}: dcp.load of {directory} gives other values"
    print(f"OK: dcp.load reads {directory}: {len(expected)} tensors exact")


def main(directory, whole_directory, dcp_directory):
    check_dcp(dcp_directory)
    check(directory)
    index = check(whole_directory)
    expected = state()
    assert set(index["weight_map"]) == set(expected), "whole tensors: the weight_map does not name every tensor"
    merged = {}
    for file in sorted(set(index["weight_map"].values())):
        merged.update(load_file(os.path.join(whole_directory, file)))
    assert set(merged) == set(expected) and all(torch.equal(merged[n], t) for n, t in expected.items()), \
        "whole tensors: load_file of the weight_map's files does not give the state"
    print(f"OK: load_file of {whole_directory}'s {len(set(index['weight_map'].values()))} files gives the whole state")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
