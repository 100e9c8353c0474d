#!/usr/bin/env python3
"""Writes the aten overloads PyTorch's DTensor shards, one per line ("aten::add.Tensor"), read from
its registries: the sharding propagator's op_single_dim_strategy_funcs, op_strategy_funcs and
op_to_rules, and the dispatcher's _custom_op_handlers. The op census test (tests/unit/op_census_test.cpp)
compares them with dtensor's rules.

Usage: pytorch_dtensor_ops.py OUTPUT_FILE
"""

import pathlib
import sys

import torch
from torch.distributed.tensor import DTensor


def qualified(overload) -> str:
    name = str(overload)  # "aten.add.Tensor", "aten.mm.default"
    namespace, rest = name.split(".", 1)
    op, _, variant = rest.rpartition(".")
    if not op:  # no overload part
        op, variant = rest, "default"
    return f"{namespace}::{op}" + ("" if variant == "default" else f".{variant}")


def main() -> None:
    propagator = DTensor._op_dispatcher.sharding_propagator
    registries = [getattr(propagator, name, {}) for name in ("op_single_dim_strategy_funcs", "op_strategy_funcs", "op_to_rules")]
    registries.append(DTensor._op_dispatcher._custom_op_handlers)
    ops = sorted({qualified(op) for registry in registries for op in registry if str(op).startswith("aten.")})
    out = pathlib.Path(sys.argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(op + "\n" for op in ops))
    print(f"PyTorch {torch.__version__}'s DTensor shards {len(ops)} aten overloads: {out}")


if __name__ == "__main__":
    main()
