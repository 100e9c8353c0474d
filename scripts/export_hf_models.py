#!/usr/bin/env python3
"""Exports Hugging Face causal LMs built from small configs (random init, no downloads) for the graph
layer's tests, with PyTorch's own outputs as reference.

    ~/.cache/dtensor/venv-torch-2.15.0/bin/python scripts/export_hf_models.py OUT_DIR

Pinned to torch 2.15.0 and transformers 5.24.0 (scripts/python-requirements.txt). Deterministic: fixed
seeds, one thread. Families (FAMILIES below): Llama with grouped-query attention (2 KV heads, fewer
than the tests' 4 tensor-parallel ranks), Mistral (8 heads over 4 KV heads), Qwen2 (biases on q, k,
v), Mixtral (a mixture of 4 experts, top 2, its experts' weights 3-d [expert, out, in] and gate/up
packed), Qwen3-MoE (4 experts, top 2 without renormalising the two weights, its second layer a dense MLP
through mlp_only_layers, q/k norms) and GPT-2 (Conv1D layers, a packed q/k/v projection, tied embeddings). Vocabulary 62: uneven
over 4 ranks on purpose.

Per family NAME, in OUT_DIR:
  NAME_train_ir.pt2   forward(input_ids [B, S] int64) -> logits [B, S, V], training IR (torch.export)
  NAME_aten.pt2       its core ATen IR (run_decompositions)
  NAME_params         the state dict (a raw tensor set, see export_test_models.py)
  NAME_io             input0 = input_ids, output0 = logits of the archive loaded back
  NAME_tp_plan.json   the model's own tensor-parallel plan as transformers writes it (model.tp_plan:
                      the config's base_model_tp_plan under the base model's prefix, plus the
                      model's, e.g. lm_head); not for GPT-2, which has none (no transformers style
                      fits its Conv1D layers).
  NAME_pp_plan.json   its pipeline plan as transformers writes it (model.pp_plan: the config's
                      base_model_pp_plan under the base model's prefix, plus lm_head), where it has one
  NAME_ep_plan.json   its expert-parallel plan as transformers writes it (model.ep_plan: the config's
                      base_model_ep_plan under the base model's prefix), for the mixtures of experts
  NAME_config.json    the config, as save_pretrained writes it
  NAME_joint.pt2      the joint forward+backward graph of forward(input_ids, labels) -> Hugging Face's
                      own causal-LM loss (ForCausalLMLoss: labels shifted with constant_pad_nd, mean
                      cross-entropy), by torch.export.experimental._export_forward_backward, batch 4;
                      exported in eval mode (no dropout), so that one process is an exact oracle.
                      GPT-2's is untied: a joint export of tied weights fails in torch 2.15 ("a
                      parameter that did not receive a gradient", the second name's placeholder).
  NAME_joint_io       input0 input_ids, input1 labels, loss and grad.PARAM for every parameter, from
                      the joint graph loaded back, checked against eager autograd
  NAME_loss_train_ir.pt2  forward(input_ids, labels) -> that loss in the training IR, for the
                      mixtures of experts (those with an expert-parallel plan): the model run eagerly
                      on DTensors, with autograd for its backward (NAME_joint_io is its reference)
Attention is exported under sdpa_kernel(MATH): torch 2.15's CPU flash-attention decomposition puts
the attention probabilities where logsumexp belongs, so core ATen and joint graphs of the default
backend are wrong (GPT-2's core ATen export fails on it outright).
The mixtures' experts run as transformers' "batched_mm" implementation (each token-expert pair selects its
expert's weights by index, then one bmm): the default loops over the experts hit (data-dependent
shapes), and "grouped_mm" is a Python custom op that no C++ program can run.
"""
import json
import os
import sys
import time

import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_test_models import io_tensors, write_set  # noqa: E402  (the raw tensor format)

assert torch.__version__.startswith("2.15."), f"pinned to torch 2.15, found {torch.__version__}"
assert transformers.__version__ == "5.24.0", f"pinned to transformers 5.24.0, found {transformers.__version__}"

VOCAB, BATCH, JOINT_BATCH, SEQ = 62, 2, 4, 16
SMALL = dict(vocab_size=VOCAB, max_position_embeddings=64, use_cache=False, tie_word_embeddings=False)
FAMILIES = {
    "llama": transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, **SMALL),
    "mistral": transformers.MistralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=8, num_key_value_heads=4, **SMALL),
    "qwen2": transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, **SMALL),
    "mixtral": transformers.MixtralConfig(hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=4, num_local_experts=4,
                                          num_experts_per_tok=2, **SMALL),
    "qwen3_moe": transformers.Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=40, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                                             num_experts_per_tok=2, mlp_only_layers=[1], **SMALL),
    "gpt2": transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                    use_cache=False, bos_token_id=0, eos_token_id=0),
}


def configure(config):
    """The attention and experts implementations every export uses (see the module docstring)."""
    config._attn_implementation = "sdpa"
    if hasattr(config, "num_local_experts") or hasattr(config, "num_experts"):
        config._experts_implementation = "batched_mm"
    return config


def save_without_provenance(ep, path):
    """torch.export.save, less the provenance (it holds Python object ids): the archive is byte-identical."""
    for node in ep.graph.nodes:
        node.meta.pop("from_node", None)
    torch.export.save(ep, path)


def math_attention_joint(ep):
    """The joint graph of `ep` as torch.export makes it, attention by the math path (see the docstring)."""
    with sdpa_kernel(SDPBackend.MATH):
        return torch.export.experimental._export_forward_backward(ep, joint_loss_index=0)


def export_joint(out_dir, name, config, make_joint=math_attention_joint, backends=(SDPBackend.MATH,), labels_shifted=False,
                 loss_program=False):
    """NAME_joint.pt2 and NAME_joint_io (see the module docstring): the joint program by
    make_joint(exported program), every model run with scaled_dot_product_attention's `backends`.
    labels_shifted: the labels are each position's next token already (transformers' shift_labels, as
    torchtitan's loader gives them for context parallelism), so the loss shifts nothing along the sequence.
    loss_program: also NAME_loss_train_ir.pt2, forward(input_ids, labels) -> loss in the training IR,
    for a caller's own autograd (NAME_joint_io is its reference too)."""
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()

    class LossOnly(type(model)):  # the model itself (parameter names unchanged), returning the loss only
        def forward(self, input_ids, labels):
            shifted = {"shift_labels": labels} if labels_shifted else {}
            return super().forward(input_ids=input_ids, labels=labels, **shifted).loss

    model.__class__ = LossOnly
    ids = torch.randint(0, VOCAB, (JOINT_BATCH, SEQ))
    # Labels of their own, another tensor: given the same tensor twice, torch.export makes one input of
    # both, and the program reads the labels where it embeds the tokens.
    labels = torch.randint(0, VOCAB, (JOINT_BATCH, SEQ))
    args = (ids, labels)
    with sdpa_kernel(list(backends)):
        exported = torch.export.export(model, args)
        if loss_program:
            save_without_provenance(exported, os.path.join(out_dir, f"{name}_loss_train_ir.pt2"))
        joint = make_joint(exported)
    path = os.path.join(out_dir, f"{name}_joint.pt2")
    save_without_provenance(joint, path)
    # The joint program's module() holds the loss only in its treespec: call the loaded graph module on
    # flat inputs in input_specs order.
    loaded = torch.export.load(path)
    state, user = {**loaded.state_dict, **loaded.constants}, iter(args)
    flat = [next(user) if s.kind.name == "USER_INPUT" else state[s.target] for s in loaded.graph_signature.input_specs]
    with torch.no_grad(), sdpa_kernel(list(backends)):
        outs = loaded.graph_module(*flat)
    with sdpa_kernel(list(backends)):
        loss = model(*args)
        loss.backward()
    tensors = []
    for spec, value in zip(loaded.graph_signature.output_specs, outs):
        if spec.kind.name == "LOSS_OUTPUT":
            assert (value - loss).abs().item() <= 1e-5, f"{name} joint loss differs from eager"
            tensors.insert(0, ("loss", value))
        elif spec.kind.name == "GRADIENT_TO_PARAMETER":
            want = model.get_parameter(spec.target).grad
            err = (value - want).abs().max().item()
            assert err <= 1e-5, f"{name} joint gradient of {spec.target} differs from eager by {err}"
            tensors.append((f"grad.{spec.target}", value))
    assert len(tensors) == 1 + len(list(model.parameters())), "expected the loss and one gradient per parameter"
    write_set(out_dir, f"{name}_joint_io", io_tensors(args, ()) + tensors)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    t0 = time.time()
    index = {"torch": torch.__version__, "transformers": transformers.__version__, "batch": BATCH, "seq": SEQ,
             "families": {}}
    for name, config in FAMILIES.items():
        torch.manual_seed(0)
        configure(config)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        ids = torch.randint(0, VOCAB, (BATCH, SEQ))
        params = write_set(out_dir, f"{name}_params", list(model.state_dict().items()))
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
            want = model(input_ids=ids).logits
            train_ir = torch.export.export(model, (ids,))
            archives = {f"{name}_train_ir": train_ir, f"{name}_aten": train_ir.run_decompositions()}
            for archive, ep in archives.items():
                path = os.path.join(out_dir, archive + ".pt2")
                save_without_provenance(ep, path)
                got = torch.export.load(path).module()(ids).logits
                err = (got - want).abs().max().item()
                assert err <= 1e-5, f"{archive}: loaded archive differs from eager by {err}"
        write_set(out_dir, f"{name}_io", io_tensors((ids,), (want,)))
        for kind, plan in (("tp", model.tp_plan), ("pp", model.pp_plan), ("ep", model.ep_plan)):
            if plan:
                with open(os.path.join(out_dir, f"{name}_{kind}_plan.json"), "w") as f:
                    json.dump(plan, f, indent=1)
        config.to_json_file(os.path.join(out_dir, f"{name}_config.json"))
        joint_config = config
        if name == "gpt2":  # untied for the joint export (see the module docstring)
            joint_config = configure(transformers.GPT2Config(**{**config.to_dict(), "tie_word_embeddings": False}))
        export_joint(out_dir, name, joint_config, loss_program=bool(model.ep_plan))
        index["families"][name] = dict(archives=list(archives) + [f"{name}_joint"], params=params, io=f"{name}_io",
                                       joint_io=f"{name}_joint_io")
        print(f"[{time.time() - t0:6.1f}s] exported {name}", flush=True)
    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump(index, f, indent=1)


if __name__ == "__main__":
    main()
