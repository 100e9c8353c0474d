"""The tensors of the checkpoint interop tests, as a formula both sides compute on their own.

tests/dist/checkpoint_interop_test.cpp computes the same values in C++ (interop_value); every value is a
multiple of 0.25 below 30 in magnitude, so float32, bfloat16 and int64 all hold it exactly.
"""
import torch

# name -> (shape, dtype): a small transformer's state, uneven over 4 ranks on purpose.
TENSORS = {
    "tok_emb.weight": ([13, 8], torch.float32),
    "blocks.0.fc1.weight": ([10, 8], torch.bfloat16),
    "blocks.0.fc1.bias": ([10], torch.float32),
    "lm_head.weight": ([13, 8], torch.float32),
    "counter": ([], torch.int64),
}


def value(index: int, shape, dtype) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    x = torch.arange(n, dtype=torch.float64).remainder(97).sub(48).mul(0.25).add(index)
    if dtype == torch.int64:
        x = x.mul(4)
    return x.reshape(shape).to(dtype)


def state() -> dict:
    return {name: value(i, shape, dtype) for i, (name, (shape, dtype)) in enumerate(TENSORS.items())}
