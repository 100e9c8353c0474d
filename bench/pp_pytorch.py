"""PyTorch's own pipelining (torch.distributed.pipelining) on the same GPT as bench/pp_step_bench.cpp, for
bench/pp_step.sh.

Same model (scripts/export_test_models.py mirrors examples/gpt module for module; 8 blocks), same
split (the embeddings with the first blocks, the blocks spread evenly, the head with the last: what
dtensor's even_split_points gives), same microbatches (M of 4 sequences), AdamW with the main job's
settings, Gloo, one intra-op thread per rank. Schedule1F1B with one stage per rank and
ScheduleInterleaved1F1B with two. A step is the schedule's step (forward, backward, loss), the
optimizer step and zero_grad, after a barrier; its time is the maximum over ranks. Prints one
Markdown row per schedule as bench/pp_step_bench.cpp does (no bubble or memory figures: PyTorch
exposes neither).

    python bench/pp_pytorch.py [--config deep|small] [--ranks P] [--microbatches M] [--rounds R]
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from local_ranks import spawn  # noqa: E402  (bench/, this script's directory)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from export_test_models import Gpt  # noqa: E402

WARMUP_STEPS, STEPS_PER_ROUND, MICROBATCH, SEED = 2, 3, 4, 1234


def config(name):
    """As bench/pp_step_bench.cpp's config_of."""
    with open(os.path.join(ROOT, "examples", "gpt", "corpus.txt"), "rb") as f:
        text = f.read()
    c = {"vocab": len(set(text)), "seq_len": 32, "dim": 128, "heads": 8, "layers": 8, "ffn": 512}
    if name == "small":
        c.update(layers=4, dim=32, heads=4, ffn=128)
    return c


class Stage(nn.Module):
    """Blocks [first, last) of the model, with the embeddings on the first stage and the head on the last."""

    def __init__(self, model, first, last, num_layers):
        super().__init__()
        self.embeds, self.heads = first == 0, last == num_layers
        if self.embeds:
            self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb
        self.blocks = nn.ModuleList(model.blocks[first:last])
        if self.heads:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head
        self.register_buffer("causal_mask", model.causal_mask)

    def forward(self, x):
        if self.embeds:
            x = self.tok_emb(x) + self.pos_emb[:x.shape[1]]
        t = x.shape[1]
        for block in self.blocks:
            x = block(x, self.causal_mask[:t, :t])
        return self.lm_head(self.ln_f(x)) if self.heads else x


def bounds(num_layers, num_stages):
    """Blocks per stage as even_split_points spreads them: the first stages one more where they do not divide."""
    per, extra = divmod(num_layers, num_stages)
    out, at = [0], 0
    for s in range(num_stages):
        at += per + (1 if s < extra else 0)
        out.append(at)
    return out


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))


def run(rank, world, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    c = config(args.config)
    generator = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(c["vocab"], (4, args.microbatches * MICROBATCH, c["seq_len"] + 1), generator=generator)
    for name, schedule_class, per_rank in (("1F1B", Schedule1F1B, 1), ("Interleaved 1F1B", ScheduleInterleaved1F1B, 2)):
        torch.manual_seed(SEED)
        model = Gpt(c)
        num_stages = world * per_rank
        edges = bounds(c["layers"], num_stages)
        indexes = [rank + k * world for k in range(per_rank)]  # the loop placement both libraries use
        stages = [PipelineStage(Stage(model, edges[s], edges[s + 1], c["layers"]), s, num_stages, torch.device("cpu"))
                  for s in indexes]
        parameters = [p for s in stages for p in s.submod.parameters()]
        optimizer = torch.optim.AdamW(parameters, lr=3e-3, weight_decay=0.01)
        schedule = (schedule_class(stages[0], args.microbatches, loss_fn=loss_fn) if per_rank == 1 else
                    schedule_class(stages, args.microbatches, loss_fn=loss_fn))

        def step(i):
            batch = tokens[i % tokens.shape[0]]
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                schedule.step(batch[:, :-1])
            elif rank == world - 1:
                schedule.step(target=batch[:, 1:])
            else:
                schedule.step()
            optimizer.step()
            optimizer.zero_grad()
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            return elapsed.item()

        for i in range(WARMUP_STEPS):
            step(i)
        times = [1e3 * step(i) for i in range(args.rounds * STEPS_PER_ROUND)]
        if rank == 0:
            q = statistics.quantiles(times, n=4)
            print(f"| {args.config} | gloo | PyTorch pipelining | {name} | {num_stages} | {statistics.median(times):.2f} | {q[0]:.2f}-{q[2]:.2f} | - | - | - |",
                  flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", choices=("deep", "small"), default="deep")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    spawn(run, args.ranks, args)


if __name__ == "__main__":
    main()
