#!/usr/bin/env python3
"""Exports a Hugging Face Llama step function, functional in its KV cache, for a C++ greedy-generation loop,
with model.generate's own tokens as reference (small config, random init, no downloads).

    ~/.cache/dtensor/venv-torch-2.15.0/bin/python scripts/export_hf_generate.py OUT_DIR

Pinned to torch 2.15.0 and transformers 5.24.0; deterministic (fixed seeds, one thread, identical files).
Llama with grouped-query attention (4 heads over 2 KV heads), vocabulary 62 (as export_hf_models.py),
batch 2 (static), no padding. initializer_range 0.5 rather than 0.02: tiny weights give near-periodic
tokens and near ties; the script requires a gap of MIN_MARGIN between the two best logits at every step, so
that another summation order (sharded matmuls) keeps the same tokens. In OUT_DIR:
  llama_generate_train_ir.pt2  step(input_ids [B, T], k0, v0, k1, v1) -> (logits [B, V] of the LAST
                               position, k0', v0', k1', v1'): past keys and values per layer [B, KV, P, D]
                               in, the whole cache [B, KV, P + T, D] out. T (new tokens, 1..64) and P (past
                               length, 0..63) are dynamic: ONE program serves prefill (P = 0) and decode
                               (T = 1). Positions P + arange(T) are derived inside. Aten ops only, no mutation.
  llama_generate_aten.pt2      its core ATen IR (run_decompositions)
  llama_generate.json          prompt ids [B, 6], generate's 12 new ids per row, the prefill logits, the
                               config numbers, the step's input/output layout, each graph's op counts and
                               the model's own tensor-parallel plan (model.tp_plan) under the step's
                               "model." prefix
Why a step function: generate grows a DynamicCache object in place, which a graph cannot carry. The step
builds a Cache of PastLayers from its inputs and returns their tensors. A stock DynamicCache(ddp_cache_data)
exports too, but its lazy init concatenates onto a torch.tensor([]) constant (lift_fresh_copy, detach_ and
a legacy 1-D empty cat in the graph), and its get_seq_length branches on keys.numel() == 0.
Exported under sdpa_kernel(MATH), as export_hf_models.py (torch 2.15's CPU flash-attention decomposition
is wrong; with the explicit boolean mask used here both backends decompose alike). The script replays both
archives, loaded back, in a greedy loop and fails unless they reproduce generate's tokens exactly.
"""
import collections
import json
import os
import sys
import time

import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.cache_utils import Cache, DynamicLayer

assert torch.__version__.startswith("2.15."), f"pinned to torch 2.15, found {torch.__version__}"
assert transformers.__version__ == "5.24.0", f"pinned to transformers 5.24.0, found {transformers.__version__}"

NAME, VOCAB, BATCH, PROMPT, NEW_TOKENS, MAX_POS = "llama_generate", 62, 2, 6, 12, 64
CONFIG = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=MAX_POS,
                                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                  initializer_range=0.5)
MIN_MARGIN = 1e-2  # least gap between the two best logits at any greedy step


class PastLayer(DynamicLayer):
    """A DynamicLayer holding given past keys and values, of any length, 0 included."""

    def __init__(self, keys, values):
        super().__init__()
        self.keys, self.values, self.is_initialized, self.device = keys, values, True, keys.device

    def get_seq_length(self):
        return self.keys.shape[-2]


class Step(torch.nn.Module):
    """step(input_ids, k0, v0, k1, v1, ...) -> (last logits, k0', v0', ...), see the module docstring."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, *past):
        cache = Cache(layers=[PastLayer(past[i], past[i + 1]) for i in range(0, len(past), 2)])
        positions = (torch.arange(input_ids.shape[1], device=input_ids.device) + past[0].shape[2]).unsqueeze(0)
        out = self.model(input_ids=input_ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
        return (out.logits[:, -1, :],) + tuple(t for layer in cache.layers for t in (layer.keys, layer.values))


def past_cache(config, length=0):
    """Random past keys and values of the given length (none at 0), interleaved k0, v0, k1, v1, ..."""
    head_dim = config.hidden_size // config.num_attention_heads
    shape = (BATCH, config.num_key_value_heads, length, head_dim)
    return tuple(torch.randn(shape) for _ in range(2 * config.num_hidden_layers))


def export(step, config):
    """The training-IR program with T and P dynamic; example sizes avoid 0 and 1 (they would specialize)."""
    new, past = torch.export.Dim("new_tokens", min=1, max=MAX_POS), torch.export.Dim("past_len", min=0, max=MAX_POS - 1)
    args = (torch.randint(0, VOCAB, (BATCH, 3)),) + past_cache(config, 5)
    shapes = ({1: new}, tuple({2: past} for _ in args[1:]))  # input_ids, then *past
    ep = torch.export.export(step, args, dynamic_shapes=shapes, strict=False)
    sig = ep.graph_signature
    assert not sig.buffers_to_mutate and not sig.user_inputs_to_mutate, "the step mutates its state"
    return ep


def check_ops(archive, ep):
    """Every call is an aten op or a SymInt operator; returns {target: count}."""
    ops = collections.Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")
    foreign = [op for op in ops if not (op.startswith("aten.") or op.startswith("<built-in function"))]
    assert not foreign, f"{archive}: non-aten ops {foreign}"
    return dict(sorted(ops.items()))


def greedy(step, prompt, config):
    """NEW_TOKENS greedy tokens of step from an empty cache, the prefill logits, the least top-2 logit gap."""
    logits, *cache = step(prompt, *past_cache(config))
    first, tokens, margin = logits, [], float("inf")
    for _ in range(NEW_TOKENS):
        top = logits.topk(2).values
        margin = min(margin, (top[:, 0] - top[:, 1]).min().item())
        tokens.append(logits.argmax(-1, keepdim=True))
        logits, *cache = step(tokens[-1], *cache)
    assert cache[0].shape[2] == PROMPT + NEW_TOKENS
    return torch.cat(tokens, 1), first, margin


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    t0 = time.time()
    torch.manual_seed(0)
    CONFIG._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(CONFIG).eval()
    prompt = torch.randint(0, VOCAB, (BATCH, PROMPT))
    step = Step(model)  # parameter names gain a "model." prefix: model.model.layers.0..., model.lm_head.weight
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                   max_new_tokens=NEW_TOKENS)[:, PROMPT:]
        assert generated.shape == (BATCH, NEW_TOKENS), f"generate stopped early: {generated.shape}"
        eager_tokens, eager_logits, margin = greedy(step, prompt, CONFIG)
        assert torch.equal(eager_tokens, generated), f"eager step {eager_tokens} != generate {generated}"
        assert margin >= MIN_MARGIN, f"near tie in the greedy choice ({margin}): pick another seed"
        train_ir = export(step, CONFIG)
        archives = {f"{NAME}_train_ir": train_ir, f"{NAME}_aten": train_ir.run_decompositions()}
        ops = {}
        for archive, ep in archives.items():
            ops[archive] = check_ops(archive, ep)
            for node in ep.graph.nodes:  # provenance holds Python object ids: drop it for identical files
                node.meta.pop("from_node", None)
            path = os.path.join(out_dir, archive + ".pt2")
            torch.export.save(ep, path)
            tokens, logits, _ = greedy(torch.export.load(path).module(), prompt, CONFIG)
            assert torch.equal(tokens, generated), f"{archive}: greedy tokens {tokens} != generate {generated}"
            err = (logits - eager_logits).abs().max().item()
            assert err <= 1e-5, f"{archive}: prefill logits differ from eager by {err}"
    layers, heads = CONFIG.num_hidden_layers, CONFIG.num_attention_heads
    index = {"torch": torch.__version__, "transformers": transformers.__version__, "archives": list(archives),
             "batch": BATCH, "layers": layers, "heads": heads, "kv_heads": CONFIG.num_key_value_heads,
             "head_dim": CONFIG.hidden_size // heads, "hidden": CONFIG.hidden_size, "vocab": VOCAB,
             "inputs": train_ir.graph_signature.user_inputs, "logits": "last position, [batch, vocab]",
             "cache": [f"{kind}.{i}" for i in range(layers) for kind in ("key", "value")],
             "new_tokens": [1, MAX_POS], "past_len": [0, MAX_POS - 1], "prompt": prompt.tolist(),
             "generated": generated.tolist(), "prefill_logits": eager_logits.tolist(), "min_margin": margin, "ops": ops,
             "tp_plan": {f"model.{path}": style for path, style in model.tp_plan.items()}}
    with open(os.path.join(out_dir, f"{NAME}.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"[{time.time() - t0:6.1f}s] exported {NAME}: {generated.tolist()}", flush=True)


if __name__ == "__main__":
    main()
