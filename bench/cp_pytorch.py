"""PyTorch's own context parallelism (torch.distributed.tensor.experimental.context_parallel) on the
attention bench/cp_bench.cpp times, for bench/cp.sh.

Same shapes (batch 1, 8 query heads, 4 key/value heads, head dim 32, causal), Gloo, CP ranks on this
machine, one intra-op thread each. PyTorch's ring kernels exist only for CUDA's flash, efficient and cuDNN
attention, so on a CPU it is expected not to run: the script then prints one Markdown row saying so, with
the error PyTorch raised (its first line), instead of times.

    python bench/cp_pytorch.py [--ranks N] [--seq S] [--rounds R]
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_ranks import spawn  # noqa: E402  (bench/, this script's directory)

QUERY_HEADS, KV_HEADS, HEAD_DIM = 8, 4, 32


def attention_step(q, k, v, grad):
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out.backward(grad)


def run(rank, ranks, args, port):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
    mesh = init_device_mesh("cpu", (ranks,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    shape = lambda heads: (1, heads, args.seq, HEAD_DIM)  # noqa: E731
    q, k, v, grad = (torch.randn(shape(h)) for h in (QUERY_HEADS, KV_HEADS, KV_HEADS, QUERY_HEADS))
    times = []
    try:
        for _ in range(args.rounds + 1):
            with context_parallel(mesh, buffers=[q, k, v, grad], buffer_seq_dims=[2, 2, 2, 2]):
                leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
                dist.barrier()
                start = time.perf_counter()
                attention_step(*leaves, grad)
                elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times.append(elapsed.item() * 1e3)
        if rank == 0:
            print(f"| {args.seq} | CP={ranks} | PyTorch context_parallel (gloo) | {statistics.median(times[1:]):.1f} | | | |")
    except Exception as e:  # noqa: BLE001  (the point is to record what PyTorch says)
        if rank == 0:
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"| {args.seq} | CP={ranks} | PyTorch context_parallel (gloo) | unable to run on CPU: "
                  f"{type(e).__name__}: {first_line.replace('|', '/')} | | | |")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spawn(run, args.ranks, args)


if __name__ == "__main__":
    main()
