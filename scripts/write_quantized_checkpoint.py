"""A block-quantized Hugging Face checkpoint (DeepSeek-V3's FP8 layout: "X.weight" in float8_e4m3fn and
"X.weight_scale_inv", one float32 per 128 x 128 block), and what PyTorch's own
QuantizedHuggingFaceStorageReader loads from it, for dtensor's dequantizing load
(tests/dist/dequantizing_load_test.cpp).

  write_quantized_checkpoint.py OUT
writes:
  OUT/checkpoint/   model.safetensors and model.safetensors.index.json: quantized weights whose shapes
                    are not multiples of the block ([300, 200]: edge blocks of 44 and 72; [100, 50] in
                    one partial block; [3, 200], fewer rows than ranks), an unquantized float32 bias, a
                    bfloat16 norm, and an MXFP4 pair (experts.w_blocks, experts.w_scales)
  OUT/expected/     model.safetensors: the state PyTorch's reader filled (dcp.load, one process), the
                    weights dequantized into float32 and bfloat16 targets
"""
import json
import os
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint import QuantizedHuggingFaceStorageReader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from write_pytorch_checkpoints import fresh  # noqa: E402

warnings.filterwarnings("ignore")

BLOCK = 128
# name -> (shape, target dtype of the state tensor it loads into)
QUANTIZED = {"layers.0.mlp.weight": ([300, 200], torch.float32), "head.weight": ([100, 50], torch.bfloat16),
             "tiny.weight": ([3, 200], torch.float32)}


def blocks(n):
    return (n + BLOCK - 1) // BLOCK


def main(out):
    g = torch.Generator().manual_seed(3)
    tensors = {}
    for name, (shape, _) in QUANTIZED.items():
        tensors[name] = (torch.randn(shape, generator=g) * 100).to(torch.float8_e4m3fn)
        tensors[name + "_scale_inv"] = torch.rand([blocks(shape[0]), blocks(shape[1])], generator=g) * 0.01 + 0.001
    tensors["layers.0.mlp.bias"] = torch.randn([300], generator=g)
    tensors["norm.weight"] = torch.randn([64], generator=g).to(torch.bfloat16)
    # An MXFP4 pair (gpt-oss's layout), which dtensor refuses to dequantize; not in PyTorch's state here.
    tensors["experts.w_blocks"] = torch.randint(0, 256, [2, 4, 16], generator=g, dtype=torch.uint8)
    tensors["experts.w_scales"] = torch.randint(120, 130, [2, 4], generator=g, dtype=torch.uint8)
    checkpoint = fresh(os.path.join(out, "checkpoint"))
    save_file(tensors, os.path.join(checkpoint, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(checkpoint, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {name: "model.safetensors" for name in tensors}}, f, indent=1)

    state = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in QUANTIZED.items()}
    state["layers.0.mlp.bias"] = torch.zeros([300])
    state["norm.weight"] = torch.zeros([64], dtype=torch.bfloat16)
    dcp.load(state, storage_reader=QuantizedHuggingFaceStorageReader(checkpoint, target_dtype=torch.float32, block_size=BLOCK),
             no_dist=True)
    save_file(state, os.path.join(fresh(os.path.join(out, "expected")), "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "done"), "w") as f:
        f.write("ok\n")


if __name__ == "__main__":
    main(sys.argv[1])
