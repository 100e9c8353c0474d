"""Checkpoints written by PyTorch itself, for dtensor to load (tests/dist/checkpoint_interop_test.cpp).

  write_pytorch_checkpoints.py OUT
writes, each into its own directory under OUT:
  save_file/     safetensors.torch.save_file of the whole state (one model.safetensors)
  hf_index/      the state split over two files with a Hugging Face model.safetensors.index.json
  dcp_whole/     torch.distributed.checkpoint.save with HuggingFaceStorageWriter, one process
  dcp_sharded/   the same from 2 Gloo ranks holding DTensors (Shard(0) and Shard(1) over a 1-d mesh),
                 save_distributed=True: per-rank files whose pieces carry DCP_SHARDING_INFO offsets
"""
import json
import os
import shutil
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from safetensors.torch import save_file
from torch.distributed.checkpoint import HuggingFaceStorageWriter
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_values import state  # noqa: E402

warnings.filterwarnings("ignore")


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def write_hf_index(path, tensors):
    names = list(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, os.path.join(path, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def sharded_rank(rank, world_size, path, init_file):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    placed = {}
    for i, (name, t) in enumerate(state().items()):
        placement = [Shard(i % t.dim())] if t.dim() > 0 else []
        placed[name] = distribute_tensor(t, mesh, placement) if placement else t
    dcp.save(placed, storage_writer=HuggingFaceStorageWriter(path, save_distributed=True))
    dist.barrier()
    dist.destroy_process_group()


def main(out):
    tensors = state()
    save_file(tensors, os.path.join(fresh(os.path.join(out, "save_file")), "model.safetensors"), metadata={"format": "pt"})
    write_hf_index(fresh(os.path.join(out, "hf_index")), tensors)
    dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(fresh(os.path.join(out, "dcp_whole"))), no_dist=True)
    init_file = os.path.join(tempfile.mkdtemp(), "init")
    mp.spawn(sharded_rank, args=(2, fresh(os.path.join(out, "dcp_sharded")), init_file), nprocs=2, join=True)
    with open(os.path.join(out, "done"), "w") as f:
        f.write("ok\n")


if __name__ == "__main__":
    main(sys.argv[1])
