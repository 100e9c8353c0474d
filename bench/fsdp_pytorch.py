"""PyTorch's own fully_shard (FSDP2) on the same GPT as bench/fsdp_bench.cpp, for bench/fsdp.sh.

Same model (scripts/export_test_models.py mirrors examples/gpt module for module), same seed and
sizes, AdamW with the main job's settings (fused=True, as dtensor's fused step), 4 ranks on Gloo,
one intra-op thread per rank, each rank with its own batch of 8; fully_shard on each block and on the
root. With --tp 2: TP=2 on mesh["tp"] (the Megatron plan: column-parallel q/k/v, fc1 and head,
row-parallel wo, fc2 and the vocabulary-parallel embedding), then fully_shard over mesh["dp"]. With
--replicas 2: HSDP, fully_shard on a ("replicate", "shard") mesh of 2 x half the ranks. Prints
one Markdown table row as bench/fsdp_bench.cpp does: median step time, middle half, and the largest peak RSS over ranks.

    python bench/fsdp_pytorch.py --config demo|large [--tp 1|2 | --replicas 1|2] [--rounds R]
"""
import argparse
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

from local_ranks import spawn  # noqa: E402  (bench/, this script's directory)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from export_test_models import GptLoss  # noqa: E402

WARMUP_STEPS, STEPS_PER_ROUND, BATCH = 3, 3, 8


def config_of(name):
    with open(os.path.join(ROOT, "examples", "gpt", "corpus.txt"), "rb") as f:
        text = f.read()
    c = {"vocab": len(set(text)), "seq_len": 32, "dim": 128, "heads": 8, "layers": 2, "ffn": 512}
    if name == "large":
        c.update(dim=512, heads=8, layers=8, ffn=2048)
    return c


def run(rank, world, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    c = config_of(args.config)
    torch.manual_seed(1234)
    model = GptLoss(c)
    if args.tp == 2:
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        plan = {"tok_emb": RowwiseParallel(input_layouts=Replicate()),
                "lm_head": ColwiseParallel(output_layouts=Replicate())}
        for i in range(c["layers"]):
            for name in ("wq", "wk", "wv"):
                plan[f"blocks.{i}.attn.{name}"] = ColwiseParallel()
            plan[f"blocks.{i}.attn.wo"] = RowwiseParallel()
            plan[f"blocks.{i}.mlp.fc1"] = ColwiseParallel()
            plan[f"blocks.{i}.mlp.fc2"] = RowwiseParallel()
        parallelize_module(model, mesh["tp"], plan)
        dp = mesh["dp"]
    elif args.replicas == 2:
        dp = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    else:
        dp = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for block in model.blocks:
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, fused=True)
    data_rank = rank if args.replicas == 2 else dp.get_local_rank()  # HSDP: every rank its own data
    generator = torch.Generator().manual_seed(1234 + data_rank)
    tokens = torch.randint(c["vocab"], (4, BATCH, c["seq_len"] + 1), generator=generator)

    def step(i):
        batch = tokens[i % tokens.shape[0]]
        dist.barrier()
        start = time.perf_counter()
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()
        return time.perf_counter() - start

    for i in range(WARMUP_STEPS):
        step(i)
    times = [step(i) for i in range(args.rounds * STEPS_PER_ROUND)]
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        q = statistics.quantiles(times, n=4)
        layout = (f"FSDP={world // 2} x TP=2" if args.tp == 2 else
                  f"HSDP: 2 replicas x FSDP={world // 2}" if args.replicas == 2 else f"FSDP={world}")
        print(f"| {args.config} | {layout} | PyTorch fully_shard | gloo | {1e3 * statistics.median(times):.1f} | "
              f"{1e3 * q[0]:.1f}-{1e3 * q[2]:.1f} | {int(rss.item())} |", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", choices=("demo", "large"), default="demo")
    parser.add_argument("--tp", type=int, choices=(1, 2), default=1)
    parser.add_argument("--replicas", type=int, choices=(1, 2), default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    spawn(run, args.ranks, args)


if __name__ == "__main__":
    main()
