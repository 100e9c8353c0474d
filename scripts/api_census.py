#!/usr/bin/env python3
"""Lists the public API of PyTorch's distributed tensor stack, one fully qualified name per line, sorted
("torch.distributed.device_mesh.DeviceMesh.get_local_rank"). docs/pytorch-api.md maps every one to its
dtensor counterpart or says why there is none; the api_census test (scripts/check_api_census.py)
compares the two.

What counts as a public name:
  - each module of MODULES: the names in its __all__; a module without __all__ (torch.distributed.checkpoint)
    gives the names of dir(module) without a leading underscore whose object is defined inside that
    module's package (its __module__ starts with the module's name), so names it imports from elsewhere
    do not count;
  - modules are not API names (checkpoint's __all__-less namespace holds its submodules `api`,
    `filesystem`, ...; a name is also left out when it is a submodule that an import elsewhere attached):
    they are skipped, whatever the list;
  - the members of the classes of MEMBERS: the attributes of the class without a leading underscore
    that its base (torch.Tensor for DTensor, nn.Module for FSDPModule) does not have, plus the private
    names the class lists as its API (DeviceMesh's _flatten and _unflatten, which torchtitan uses);
  - FSDP1: torch.distributed.fsdp's __all__ holds FSDP1's wrapper class and its configuration types
    next to FSDP2's. They are listed like the others (a user porting FSDP1 code looks them up), tagged
    "FSDP1" in a second, tab-separated column: the names whose object is defined in one of FSDP1_MODULES.
    The test requires their notes to say so. FSDP1's classes' members are not listed.

Usage: api_census.py [OUTPUT_FILE]   (without OUTPUT_FILE, prints the list)
"""

import importlib
import pathlib
import sys
import types

MODULES = [
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.tensor.experimental",
    "torch.distributed.tensor.debug",
    "torch.distributed.device_mesh",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
]

# Class (as listed above) -> (the base whose attributes are not its own API, private names that are).
MEMBERS = {
    "torch.distributed.tensor.DTensor": ("torch.Tensor", ()),
    "torch.distributed.device_mesh.DeviceMesh": ("builtins.object", ("_flatten", "_unflatten")),
    "torch.distributed.fsdp.FSDPModule": ("torch.nn.Module", ()),
}

# Where FSDP1 (FullyShardedDataParallel) defines what torch.distributed.fsdp exports of it.
FSDP1_MODULES = ("torch.distributed.fsdp.api", "torch.distributed.fsdp.fully_sharded_data_parallel")
FSDP1_TAG = "FSDP1"


def resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def module_names(module_name: str) -> dict[str, object]:
    module = importlib.import_module(module_name)
    listed = getattr(module, "__all__", None)
    if listed is not None:
        names = {name: getattr(module, name) for name in listed}
    else:
        names = {}
        for name in dir(module):
            value = getattr(module, name)
            if not name.startswith("_") and (getattr(value, "__module__", None) or "").startswith(module_name):
                names[name] = value
    return {name: value for name, value in names.items() if not isinstance(value, types.ModuleType)}


def member_names(cls: type, base: type, private: tuple[str, ...]) -> list[str]:
    public = [name for name in dir(cls) if not name.startswith("_") and not hasattr(base, name)]
    missing = [name for name in private if not hasattr(cls, name)]
    if missing:
        raise SystemExit(f"{cls.__qualname__} has no {', '.join(missing)}: update MEMBERS in {__file__}")
    return public + list(private)


def census() -> dict[str, str]:
    """Every public name -> its tag ("" or FSDP1_TAG)."""
    out: dict[str, str] = {}
    for module_name in MODULES:
        for name, value in module_names(module_name).items():
            defined_in = getattr(value, "__module__", None) or ""
            out[f"{module_name}.{name}"] = FSDP1_TAG if defined_in in FSDP1_MODULES else ""
    for cls_name, (base_name, private) in MEMBERS.items():
        if cls_name not in out:
            raise SystemExit(f"{cls_name} is not in the census any more: update MEMBERS in {__file__}")
        for member in member_names(resolve(cls_name), resolve(base_name), private):
            out[f"{cls_name}.{member}"] = ""
    return out


def main() -> None:
    import torch

    names = census()
    text = "".join(name + (f"\t{tag}" if tag else "") + "\n" for name, tag in sorted(names.items()))
    if len(sys.argv) < 2:
        sys.stdout.write(text)
        return
    out = pathlib.Path(sys.argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"PyTorch {torch.__version__}: {len(names)} public names of its distributed tensor API: {out}")


if __name__ == "__main__":
    main()
