"""A training checkpoint as a PyTorch trainer writes it: a TP x FSDP model and its AdamW state, saved by
torch.distributed.checkpoint.save (FileSystemWriter) from 4 Gloo ranks, for dtensor to load onto other
meshes (tests/dist/dcp_training_load_test.cpp).

  write_dcp_training_checkpoint.py OUT
writes into OUT:
  checkpoint/      dcp.save({"model": model_sd, "optim": optim_sd}) of get_state_dict(model, optim),
                   taken after two AdamW steps on a ("dp", "tp") = 2 x 2 mesh: each block's w1
                   ColwiseParallel and w2 RowwiseParallel over tp, then fully_shard over dp on each block
                   and the root. Uneven on purpose: the hidden 10 is 5 per tp rank, then 3 and 2 per dp
                   rank; the embedding's 11 rows and the head's 5 split 6/5 and 3/2 over dp.
  expected/model.safetensors
                   the same state, whole (get_state_dict with full_state_dict=True), under the names DCP
                   gave it ("model.layers.0.w1.weight", "optim.state.layers.0.w1.weight.exp_avg", ...).
                   The AdamW step counts are float32 0-d tensors, as PyTorch keeps them.
The model (TrainNet below) is rebuilt in C++ by the test with the same names and shapes.
"""
import logging
import os
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn as nn
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from write_pytorch_checkpoints import fresh  # noqa: E402

warnings.filterwarnings("ignore")
# FSDP's full_state_dict gathers (_StridedShard, Shard) in two all-gathers and says so on every rank.
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)

VOCAB, DIM, HIDDEN, CLASSES, BLOCKS = 11, 6, 10, 5, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.w2(torch.relu(self.w1(x)))


class TrainNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Block() for _ in range(BLOCKS)])
        self.head = nn.Linear(DIM, CLASSES, bias=False)

    def forward(self, tokens):
        h = self.emb(tokens)
        for block in self.layers:
            h = block(h)
        return self.head(h)


def flat(model_sd, optim_sd):
    """The names dcp.save gives {"model": model_sd, "optim": optim_sd}'s tensors."""
    out = {"model." + name: t for name, t in model_sd.items()}
    for fqn, entries in optim_sd["state"].items():
        out.update({f"optim.state.{fqn}.{name}": t for name, t in entries.items()})
    return out


def rank_main(rank, world_size, out, init_file):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)  # the same initial model on every rank
    model = TrainNet()
    for block in model.layers:
        parallelize_module(block, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optim = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    data = torch.Generator().manual_seed(100 + mesh["dp"].get_local_rank())  # each dp rank its own batch
    for _ in range(2):
        tokens = torch.randint(0, VOCAB, (3, 4), generator=data)
        labels = torch.randint(0, CLASSES, (3, 4), generator=data)
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
        loss.backward()
        optim.step()
        optim.zero_grad()
    model_sd, optim_sd = get_state_dict(model, optim)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(out, "checkpoint"))
    full_model, full_optim = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True))
    if rank == 0:
        whole = {name: t.detach().contiguous() for name, t in flat(full_model, full_optim).items()}
        save_file(whole, os.path.join(out, "expected", "model.safetensors"), metadata={"format": "pt"})
    dist.barrier()
    dist.destroy_process_group()


def main(out):
    fresh(out)
    os.makedirs(os.path.join(out, "checkpoint"))
    os.makedirs(os.path.join(out, "expected"))
    init_file = os.path.join(tempfile.mkdtemp(), "init")
    mp.spawn(rank_main, args=(4, out, init_file), nprocs=4, join=True)
    with open(os.path.join(out, "done"), "w") as f:
        f.write("ok\n")


if __name__ == "__main__":
    main(sys.argv[1])
