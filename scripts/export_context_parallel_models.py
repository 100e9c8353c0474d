#!/usr/bin/env python3
"""Writes the exported programs the graph level's context-parallel tests expand over a sequence-sharded
mesh dim: the test GPT of export_test_models.py with fused causal attention.

    /root/.cache/dtensor/venv-torch-2.15.0/bin/python scripts/export_context_parallel_models.py OUT_DIR

  gpt_fused_joint.pt2   the joint forward+backward graph of GptLoss (the same parameter names as
                        gpt_joint.pt2, its own seed) whose attention is scaled_dot_product_attention(
                        is_causal=True) instead of a masked softmax, so that the graph holds
                        aten._scaled_dot_product_flash_attention_for_cpu and its backward: the nodes
                        context-parallel attention runs as. Batch 2, 32 positions.
  gpt_fused_joint_io    input0 tokens, input1 targets, loss and grad.PARAM for every parameter, from
                        the joint graph loaded back, checked against eager autograd.
  llama_causal_joint.pt2, llama_causal_joint_io
                        Hugging Face Llama (export_hf_models.py's config and seed: grouped-query
                        attention, 4 heads over 2 KV heads, 16 positions, batch 4) with its own
                        causal-LM loss, as export_hf_models.py writes llama_joint, but its attention is
                        scaled_dot_product_attention(is_causal=True) with no mask: transformers builds
                        a mask tensor whenever it exports ("causal_sdpa" below drops it), and a mask
                        keeps attention off the flash kernel. Its labels are the next tokens already
                        (transformers' shift_labels, as torchtitan's loader shards them with the tokens):
                        a shift inside the loss would move each sequence block's first label to the
                        rank before. The reference is PyTorch's eager model.
  llama_causal_loss_train_ir.pt2
                        the same model's forward(input_ids, labels) -> loss in the training IR (the
                        attention the composite scaled_dot_product_attention), for eager DTensor runs
                        with autograd; llama_causal_joint_io is its reference too.
  llama_causal_loss_aten.pt2
                        that program in core ATen (the flash op kept whole), module paths kept.

torch 2.15's core ATen decomposition of the CPU flash op is wrong (it puts the attention probabilities
where logsumexp belongs; see export_hf_models.py), so the joint graph is made as
_export_forward_backward makes it but with both flash ops left out of the decomposition table: they stay
whole, as their kernels compute them.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch.export.exported_program import _decompose_exported_program
from torch.export.experimental import _copy_graph_module_and_signature, _remove_detach_pass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_test_models import GPT, Attention, GptLoss, io_tensors, write_set  # noqa: E402
import export_hf_models  # noqa: E402

BATCH = 2
FLASH = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
         torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default)


def fused_forward(self, x, causal_mask):
    """Attention.forward with causal scaled_dot_product_attention (the mask argument unused)."""
    b, t = x.shape[0], x.shape[1]
    heads = lambda y: y.view(b, t, -1, self.head_dim).transpose(1, 2)  # noqa: E731
    q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
    return self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1))


def joint_keeping_flash(ep):
    """torch.export.experimental._export_forward_backward(ep), the flash ops kept whole."""
    table = core_aten_decompositions()
    for op in FLASH:
        table.pop(op, None)
    ep = _decompose_exported_program(ep, cia_to_decomp={}, python_decomp_table=table, joint_loss_index=0,
                                     decompose_custom_triton_ops=False)
    gm, signature = _copy_graph_module_and_signature(ep)
    _remove_detach_pass(gm, signature)
    return ep._update(gm, signature)


def export_causal_llama(out_dir):
    """llama_causal_joint.pt2 and llama_causal_joint_io (see the module docstring)."""
    import transformers
    from torch.nn.attention import SDPBackend
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    # With no mask, transformers' sdpa attention passes is_causal=True; the mask function makes none.
    transformers.AttentionInterface.register("causal_sdpa", sdpa_attention_forward)
    AttentionMaskInterface.register("causal_sdpa", lambda *args, **kwargs: None)
    config = export_hf_models.configure(export_hf_models.FAMILIES["llama"])
    config._attn_implementation = "causal_sdpa"
    export_hf_models.export_joint(out_dir, "llama_causal", config, make_joint=joint_keeping_flash,
                                  backends=(SDPBackend.FLASH_ATTENTION, SDPBackend.MATH), labels_shifted=True,
                                  loss_program=True)
    joint = torch.export.load(os.path.join(out_dir, "llama_causal_joint.pt2"))
    flash = [n for n in joint.graph.nodes if n.target == FLASH[0]]
    assert flash and all(n.args[4] is True for n in flash), "llama_causal: attention is not the causal flash op"
    # The loss program in core ATen (cross_entropy_loss, composite, decomposed; the flash op kept whole),
    # its module paths kept: for graph programs that place values by module.
    table = torch.export.default_decompositions()
    for op in FLASH:
        table.pop(op, None)
    loss = torch.export.load(os.path.join(out_dir, "llama_causal_loss_train_ir.pt2")).run_decompositions(table)
    assert any(n.target == FLASH[0] for n in loss.graph.nodes), "llama_causal_loss_aten: the flash op was decomposed"
    export_hf_models.save_without_provenance(loss, os.path.join(out_dir, "llama_causal_loss_aten.pt2"))


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    Attention.forward = fused_forward  # this process exports only the fused model
    model = GptLoss(GPT).train()
    tokens = torch.randint(0, GPT["vocab"], (BATCH, GPT["seq_len"]))
    targets = torch.randint(0, GPT["vocab"], (BATCH, GPT["seq_len"]))
    args = (tokens, targets)
    joint = joint_keeping_flash(torch.export.export(model, args))
    kinds = {str(n.target) for n in joint.graph.nodes if n.op == "call_function"}
    assert all(str(op) in kinds for op in FLASH), "the flash ops were decomposed"
    for node in joint.graph.nodes:  # provenance holds Python object ids: drop it, the archive stays byte-identical
        node.meta.pop("from_node", None)
    path = os.path.join(out_dir, "gpt_fused_joint.pt2")
    torch.export.save(joint, path)

    loaded = torch.export.load(path)
    state, user = {**loaded.state_dict, **loaded.constants}, iter(args)
    flat = [next(user) if s.kind.name == "USER_INPUT" else state[s.target] for s in loaded.graph_signature.input_specs]
    with torch.no_grad():
        outs = loaded.graph_module(*flat)
    loss = model(*args)
    loss.backward()
    reference = [("loss", None)]
    for spec, value in zip(loaded.graph_signature.output_specs, outs):
        want = loss.detach() if spec.kind.name == "LOSS_OUTPUT" else model.get_parameter(spec.target).grad
        err = (value - want).abs().max().item()
        assert err <= 1e-4, f"gpt_fused_joint {spec.target or 'loss'}: the loaded graph differs from eager by {err}"
        if spec.kind.name == "LOSS_OUTPUT":
            reference[0] = ("loss", value)
        else:
            reference.append((f"grad.{spec.target}", value))
    write_set(out_dir, "gpt_fused_joint_io", io_tensors(args, ()) + reference)
    export_causal_llama(out_dir)
    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump({"torch": torch.__version__, "gpt_config": GPT, "batch": BATCH,
                   "archives": {"gpt_fused_joint": {"archive": "gpt_fused_joint.pt2", "io": ["gpt_fused_joint_io"]},
                                "llama_causal_joint": {"archive": "llama_causal_joint.pt2", "io": ["llama_causal_joint_io"]}}},
                  f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
