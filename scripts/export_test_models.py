#!/usr/bin/env python3
"""Writes torch.export .pt2 archives plus reference tensors for the C++ .pt2 reader's tests.

    /root/.cache/dtensor/venv-torch-2.15.0/bin/python scripts/export_test_models.py OUT_DIR

Pinned to torch 2.15.0 (the project's venv). Deterministic: fixed seeds, one thread.

Archives (torch.export.save):
  mlp.pt2                 Linear(16,32) -> GELU -> Linear(32,16), input [4,16] float32.
  mlp_deflated.pt2        mlp.pt2 re-zipped with deflate by Python's zipfile (the .pt2 reader's tests).
  mlp_head.pt2            the same MLP, then LayerNorm(16) and Linear(16,8) (a head).
  mlp_extras.pt2          the same MLP plus what the plain one lacks: a non-persistent buffer
                          (`scale`), a plain tensor attribute (lifted as a tensor constant `offset`)
                          and an int64 counter buffer mutated in forward (`calls`), so the graph has
                          BUFFER(persistent=false) and CONSTANT_TENSOR inputs; training IR, where the
                          mutation stays an in-place aten.add_ on the buffer's placeholder.
  mlp_extras_aten.pt2     its core ATen IR (run_decompositions): the mutation becomes a functional
                          add whose result is a BUFFER_MUTATION output.
  gpt_train_ir_static.pt2 the GPT of examples/gpt/gpt_model.h (same parameter names), forward(tokens
                          [B,S] int64) -> logits [B,S,V]; training IR (torch.export.export), B = 8.
  gpt_train_ir_dynamic.pt2  the same with a dynamic batch dimension (torch.export.Dim "batch").
  gpt_aten_static.pt2     core ATen IR: ep.run_decompositions() of the static one.
  gpt_aten_dynamic.pt2    core ATen IR of the dynamic one.
  gpt_joint.pt2           joint forward+backward graph of forward(tokens, targets) -> mean
                          cross-entropy (the C++ model's own forward), made by
                          torch.export.experimental._export_forward_backward (which runs the core ATen
                          decompositions itself); outputs: LOSS_OUTPUT then one GRADIENT_TO_PARAMETER each.
  mlp_joint.pt2           joint forward+backward graph of the MLP's forward(x, target) -> mean squared
                          error, made the same way.

Reference tensors, in a raw format (no Python needed to read it). A "set" NAME is two files:
  NAME.json  {"format": "dtensor-raw-tensors-v1",
              "tensors": [{"name": str, "dtype": str, "shape": [int...], "offset": int, "nbytes": int}]}
  NAME.bin   the tensors' bytes, each C-contiguous, little-endian, at its byte offset (64-byte aligned).
  dtype is one of: float32 float64 float16 bfloat16 int64 int32 int16 int8 uint8 bool.
Sets:
  mlp_params, mlp_extras_params, gpt_params   state dicts (parameters, persistent buffers; for
                                               mlp_extras also ep.constants: the non-persistent buffer
                                               `scale` and the constant `offset`); the gpt_* archives
                                               share gpt_params.
  MODEL_io[_bB]  input0.. = example inputs, output0.. = outputs of torch.export.load(MODEL.pt2).module()
                 (dynamic models: _b8 and _b3, two batch sizes; mlp_extras*: user outputs of a first
                 call, i.e. with `calls` = 0 before and 1 after).
  gpt_joint_io   input0 tokens, input1 targets, loss (from the joint graph), grad.PARAM for every
                 parameter (from the joint graph; checked against eager autograd).
  mlp_joint_io   input0 x, input1 target.
index.json lists archives and sets with torch version and the GPT config.
"""
import copy
import ctypes
import json
import math
import os
import sys
import time
import zipfile

import torch
import torch.export.experimental  # not imported by torch.export itself
import torch.nn as nn
import torch.nn.functional as F

assert torch.__version__.startswith("2.15."), f"pinned to torch 2.15, found {torch.__version__}"

# The GPT demo config of examples/gpt/training.h (vocab = the corpus' 42 distinct characters, which
# is uneven over 4 ranks on purpose; heads divisible by 4).
GPT = dict(vocab=42, seq_len=32, dim=128, heads=8, layers=2, ffn=512)
BATCH, SMALL_BATCH = 8, 3


# ---------------------------------------------------------------- models
class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MlpLoss(Mlp):
    def forward(self, x, target):
        return F.mse_loss(super().forward(x), target)


class MlpHead(Mlp):
    """The MLP then a layer norm and a head: under TP (fc1 colwise, fc2 rowwise, the rest replicated)
    node-by-node choice reduce-scatters fc2's partial sum for the layer norm and gathers the head's
    output; the whole graph sees that one all-reduce costs less (tests/dist/graph/spmd_test.cpp)."""
    def __init__(self):
        super().__init__()
        self.ln, self.head = nn.LayerNorm(16), nn.Linear(16, 8)

    def forward(self, x):
        return self.head(self.ln(super().forward(x)))


class MlpExtras(Mlp):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((16,), 0.5), persistent=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.offset = torch.arange(16, dtype=torch.float32)  # plain attribute: becomes a lifted constant

    def forward(self, x):
        self.calls.add_(1)  # in-place buffer update: a BUFFER_MUTATION output in the exported graph
        return super().forward(x) * self.scale + self.offset


# The GPT mirrors examples/gpt/gpt_model.h module for module, so state dict names match the C++
# named_parameters(): tok_emb.weight, pos_emb, causal_mask, blocks.N.{ln1,attn.{wq,wk,wv,wo},ln2,
# mlp.{fc1,fc2}}.{weight,bias}, ln_f.*, lm_head.weight (no bias).
class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.head_dim = c["dim"] // c["heads"]
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(c["dim"], c["dim"]) for _ in range(4))

    def forward(self, x, causal_mask):
        b, t = x.shape[0], x.shape[1]
        heads = lambda y: y.view(b, t, -1, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        attention = torch.softmax(scores + causal_mask, -1)
        return self.wo(torch.matmul(attention, v).transpose(1, 2).reshape(b, t, -1))


class MlpBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c["dim"], c["ffn"]), nn.Linear(c["ffn"], c["dim"])

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))  # exact GELU, as at::gelu's default


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(c["dim"]), Attention(c)
        self.ln2, self.mlp = nn.LayerNorm(c["dim"]), MlpBlock(c)

    def forward(self, x, causal_mask):
        h = x + self.attn(self.ln1(x), causal_mask)
        return h + self.mlp(self.ln2(h))


class Gpt(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok_emb = nn.Embedding(c["vocab"], c["dim"])
        self.pos_emb = nn.Parameter(torch.randn(c["seq_len"], c["dim"]) * 0.02)
        self.register_buffer("causal_mask", torch.triu(torch.full((c["seq_len"], c["seq_len"]), -1e9), 1))
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(c["dim"])
        self.lm_head = nn.Linear(c["dim"], c["vocab"], bias=False)

    def forward(self, tokens):  # tokens [B, S] int64 -> logits [B, S, V]
        t = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb[:t]
        mask = self.causal_mask[:t, :t]
        for block in self.blocks:
            x = block(x, mask)
        return self.lm_head(self.ln_f(x))


class GptLoss(Gpt):
    """The C++ Gpt's forward: (tokens, targets) -> mean next-token cross-entropy. A subclass, not a
    wrapper, so the parameter names stay those of Gpt."""

    def forward(self, tokens, targets):
        logits = super().forward(tokens)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))


# ---------------------------------------------------------------- raw tensor sets
DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
          torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
          torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool"}
assert sys.byteorder == "little"


def write_set(out_dir, name, tensors):
    """tensors: list of (name, tensor). Writes NAME.json + NAME.bin (see the module docstring)."""
    entries, offset = [], 0
    with open(os.path.join(out_dir, name + ".bin"), "wb") as f:
        for tname, t in tensors:
            t = t.detach().to("cpu").contiguous()
            pad = -offset % 64
            f.write(b"\0" * pad)
            offset += pad
            f.write(ctypes.string_at(t.data_ptr(), t.nbytes) if t.nbytes else b"")
            entries.append(dict(name=tname, dtype=DTYPES[t.dtype], shape=list(t.shape), offset=offset,
                                nbytes=t.nbytes))
            offset += t.nbytes
    with open(os.path.join(out_dir, name + ".json"), "w") as f:  # one tensor a line
        f.write('{"format": "dtensor-raw-tensors-v1", "tensors": [\n')
        f.write(",\n".join(json.dumps(e) for e in entries) + "\n]}\n")
    return name


def io_tensors(inputs, outputs):
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return [(f"input{i}", t) for i, t in enumerate(inputs)] + [(f"output{i}", t) for i, t in enumerate(outputs)]


# ---------------------------------------------------------------- main
def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    index = {"torch": torch.__version__, "gpt_config": GPT, "batch": BATCH, "small_batch": SMALL_BATCH,
             "archives": {}}
    t0 = time.time()

    def save(name, ep, params, io_sets, **extra):
        path = os.path.join(out_dir, name + ".pt2")
        # Decomposition passes record provenance ("from_node") holding Python object ids, the only
        # thing that would differ between runs: drop it so that the archives are byte-identical.
        for node in ep.graph.nodes:
            node.meta.pop("from_node", None)
        torch.export.save(ep, path)
        index["archives"][name] = dict(archive=name + ".pt2", params=params, io=io_sets, **extra)
        print(f"[{time.time() - t0:6.1f}s] wrote {path}", flush=True)

    def check(name, got, want, atol=1e-5):
        err = (got - want).abs().max().item()
        assert err <= atol, f"{name}: loaded archive differs from eager by {err}"

    # Outputs always come from the archive loaded back (torch.export.load), so the reference data
    # also proves the round trip; they are checked against eager PyTorch.
    def run_loaded(name, inputs):
        return torch.export.load(os.path.join(out_dir, name + ".pt2")).module()(*inputs)

    with torch.no_grad():
        # -- MLP
        mlp = Mlp().eval()
        x = (torch.randn(4, 16),)
        save("mlp", torch.export.export(mlp, x), write_set(out_dir, "mlp_params", list(mlp.state_dict().items())), [])
        y = run_loaded("mlp", x)
        check("mlp", y, mlp(*x))
        index["archives"]["mlp"]["io"].append(write_set(out_dir, "mlp_io", io_tensors(x, y)))
        # The same archive re-zipped with deflate by Python's zipfile, as a user's zip tool would:
        # PyTorch loads it (a directory entry first, records unaligned, sizes in the local headers, no
        # data descriptors).
        with zipfile.ZipFile(os.path.join(out_dir, "mlp.pt2")) as stored, \
                zipfile.ZipFile(os.path.join(out_dir, "mlp_deflated.pt2"), "w", zipfile.ZIP_DEFLATED) as deflated:
            deflated.writestr(zipfile.ZipInfo("mlp/", date_time=(1980, 1, 1, 0, 0, 0)), b"")
            for info in stored.infolist():
                deflated.writestr(zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0)), stored.read(info),
                                  compress_type=zipfile.ZIP_DEFLATED)
        check("mlp_deflated", run_loaded("mlp_deflated", x), y)
        index["archives"]["mlp_deflated"] = dict(archive="mlp_deflated.pt2", params=index["archives"]["mlp"]["params"], io=[])

        # -- MLP with a layer norm and a head (for the whole-graph strategy choice); its own seed, so
        # that the models after it keep their weights
        with torch.random.fork_rng():
            torch.manual_seed(1)
            head = MlpHead().eval()
        save("mlp_head", torch.export.export(head, x), write_set(out_dir, "mlp_head_params", list(head.state_dict().items())), [])
        y = run_loaded("mlp_head", x)
        check("mlp_head", y, head(*x))
        index["archives"]["mlp_head"]["io"].append(write_set(out_dir, "mlp_head_io", io_tensors(x, y)))

        # -- MLP with a non-persistent buffer, a tensor constant and a buffer mutation. Training IR
        # keeps the counter update as an in-place aten.add_ on the buffer's placeholder; core ATen IR
        # functionalizes it into a BUFFER_MUTATION output: keep both forms. The exported programs'
        # state dicts alias the module's buffers, so eager runs go to a copy (`calls` stays 0).
        extras = MlpExtras().eval()
        ep = torch.export.export(extras, x)
        want = copy.deepcopy(extras)(*x)
        # ep.constants holds the non-persistent buffer `scale` and the lifted constant `offset`
        params = write_set(out_dir, "mlp_extras_params", list(extras.state_dict().items()) + list(ep.constants.items()))
        for name, program in (("mlp_extras", ep), ("mlp_extras_aten", ep.run_decompositions())):
            save(name, program, params, [])
            y = run_loaded(name, x)
            check(name, y, want)
            index["archives"][name]["io"].append(write_set(out_dir, f"{name}_io", io_tensors(x, y)))

        # -- GPT: forward to logits, four variants from one seeded model
        gpt = Gpt(GPT).eval()
        gpt_params = write_set(out_dir, "gpt_params", list(gpt.state_dict().items()))
        tokens = {b: torch.randint(0, GPT["vocab"], (b, GPT["seq_len"])) for b in (BATCH, SMALL_BATCH)}
        ep_static = torch.export.export(gpt, (tokens[BATCH],))
        batch = torch.export.Dim("batch", min=1, max=1024)
        ep_dynamic = torch.export.export(gpt, (tokens[BATCH],), dynamic_shapes=({0: batch},))
        for name, ep, batches in (("gpt_train_ir_static", ep_static, [BATCH]),
                                  ("gpt_train_ir_dynamic", ep_dynamic, [BATCH, SMALL_BATCH]),
                                  ("gpt_aten_static", ep_static.run_decompositions(), [BATCH]),
                                  ("gpt_aten_dynamic", ep_dynamic.run_decompositions(), [BATCH, SMALL_BATCH])):
            save(name, ep, gpt_params, [], dynamic_batch=len(batches) > 1)
            for b in batches:
                y = run_loaded(name, (tokens[b],))
                check(name, y, gpt(tokens[b]), atol=1e-4)
                index["archives"][name]["io"].append(write_set(out_dir, f"{name}_io_b{b}", io_tensors((tokens[b],), y)))

    # -- GPT joint forward+backward (training graph). Export must run with grad mode on (under
    # no_grad, _export_forward_backward fails: "output ... marked as the loss ... does not require
    # gradients"). It takes the training-IR program (an already decomposed one works too), runs the
    # core ATen decompositions itself, tags output joint_loss_index LOSS_OUTPUT and appends one
    # GRADIENT_TO_PARAMETER output per parameter (in input_specs order).
    model = GptLoss(GPT)
    model.load_state_dict(gpt.state_dict())
    model.train()
    targets = torch.randint(0, GPT["vocab"], (BATCH, GPT["seq_len"]))
    args = (tokens[BATCH], targets)
    joint = torch.export.experimental._export_forward_backward(torch.export.export(model, args), joint_loss_index=0)
    save("gpt_joint", joint, gpt_params, [])
    # The joint program's module() fails (its output treespec holds the loss only, the graph returns
    # 38 values), so call the loaded graph module directly: flat inputs in input_specs order
    # (parameters, buffers, user inputs), outputs in output_specs order.
    loaded = torch.export.load(os.path.join(out_dir, "gpt_joint.pt2"))
    state, user = {**loaded.state_dict, **loaded.constants}, iter(args)
    flat = [next(user) if s.kind.name == "USER_INPUT" else state[s.target] for s in loaded.graph_signature.input_specs]
    with torch.no_grad():
        outs = loaded.graph_module(*flat)
    # eager reference
    loss = model(*args)
    loss.backward()
    grads = []
    for spec, value in zip(loaded.graph_signature.output_specs, outs):
        kind = spec.kind.name
        if kind == "LOSS_OUTPUT":
            check("gpt_joint loss", value, loss.detach(), atol=1e-5)
            grads.insert(0, ("loss", value))
        elif kind == "GRADIENT_TO_PARAMETER":
            check(f"gpt_joint grad {spec.target}", value, model.get_parameter(spec.target).grad, atol=1e-4)
            grads.append((f"grad.{spec.target}", value))
    assert len(grads) == 1 + len(list(model.parameters())), "expected the loss and one gradient per parameter"
    index["archives"]["gpt_joint"]["io"].append(write_set(out_dir, "gpt_joint_io", io_tensors(args, ()) + grads))

    # -- The MLP's joint forward+backward with a mean squared error (tests/compiled/ compiles and trains
    # it on 4 ranks); its own seed, so that the models before it keep their weights.
    with torch.random.fork_rng():
        torch.manual_seed(2)
        mlp_loss = MlpLoss()
        args = (torch.randn(4, 16), torch.randn(4, 16))
    joint = torch.export.experimental._export_forward_backward(torch.export.export(mlp_loss, args), joint_loss_index=0)
    save("mlp_joint", joint, [], [])
    index["archives"]["mlp_joint"]["io"].append(write_set(out_dir, "mlp_joint_io", io_tensors(args, ())))

    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"[{time.time() - t0:6.1f}s] done: {out_dir}")


if __name__ == "__main__":
    main()
