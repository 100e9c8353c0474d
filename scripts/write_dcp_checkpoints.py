"""Checkpoints in PyTorch's own DCP format (FileSystemWriter: .distcp files and a pickled .metadata),
written by torch.distributed.checkpoint.save, for dtensor's DCP reader (tests/files/dcp_metadata_test.cpp).

  write_dcp_checkpoints.py OUT
writes, each into its own directory under OUT:
  dcp_single/    dcp.save(no_dist=True) from one process: whole tensors of several dtypes and uneven
                 shapes (a 0-d one, a nested dict's), and bytes entries (an int, a string, a list)
  dcp_sharded/   dcp.save from 4 Gloo ranks on a 2 x 2 mesh: DTensors sharded on one or both mesh dims,
                 unevenly (7 rows over 2 ranks, 5 columns over 2 ranks), a replicated one, a plain tensor,
                 and bytes entries: chunked tensors whose chunks tile the global shape
and beside each .metadata an expected.json: the metadata as PyTorch's own reader (pickle.load, through
FileSystemReader.read_metadata) sees it, field by field, for the C++ test to compare against.
  dcp_objects/   dcp.save(no_dist=True) of bytes entries for read_objects: every builtin kind (a float, a
                 tuple, a list, a tuple of a dict with string and int keys (a dict alone DCP flattens), True, None, a nested list), and two it
                 refuses: a datetime.date (an object of a class) and a tuple holding a tensor
dcp_single/ also holds its metadata pickled again at protocols 2, 3 and 5 (metadata_protocol_N.pickle;
dcp.save writes protocol 4), and
  dcp_bad/       dcp_single's metadata with one field made wrong per file (CASE.metadata), pickled by
                 Python: what a damaged or crafted checkpoint holds, for the reader to refuse
  dcp_bad_items/ tensor items as FileSystemWriter writes them (a torch.save zip: data.pkl, data/0), one
                 per file (CASE.item), each for a chunk of sizes [2, 3] of float32 holding 0..5: good ones
                 (row-major, transposed, _rebuild_tensor_v3) and ones with one thing made wrong; and
                 shared_string.item, a bytes entry referring to one string 200000 times
"""
import collections
import copy
import datetime
import io
import json
import os
import pickle
import sys
import tempfile
import warnings
import zipfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, ChunkStorageMetadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_values import value  # noqa: E402
from write_pytorch_checkpoints import fresh  # noqa: E402

warnings.filterwarnings("ignore")


# name -> (shape, dtype): uneven over a 2 x 2 mesh on purpose; values from checkpoint_values.value.
TENSORS = {
    "w": ([7, 5], torch.float32),
    "emb.weight": ([10, 3], torch.bfloat16),
    "bias": ([5], torch.float16),
    "counts": ([3, 2], torch.int64),
    "scale": ([], torch.float64),
    "mask": ([4], torch.bool),
}


def values():
    return {name: value(i, shape, dtype) for i, (name, (shape, dtype)) in enumerate(TENSORS.items())}


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def expected(path):
    """The metadata as PyTorch reads it, in plain JSON."""
    meta = FileSystemReader(path).read_metadata()
    entries = {}
    for fqn, md in meta.state_dict_metadata.items():
        if isinstance(md, BytesStorageMetadata):
            entries[fqn] = {"kind": "bytes"}
        else:
            assert isinstance(md, TensorStorageMetadata)
            p = md.properties
            entries[fqn] = {"kind": "tensor", "dtype": dtype_name(p.dtype), "size": list(md.size),
                            "requires_grad": p.requires_grad, "pin_memory": p.pin_memory,
                            "strides": None if p.strides is None else list(p.strides),
                            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in md.chunks]}
    storage = [{"fqn": index.fqn, "offset": None if index.offset is None else list(index.offset), "index": index.index,
                "relative_path": info.relative_path, "file_offset": info.offset, "length": info.length}
               for index, info in meta.storage_data.items()]
    sm = meta.storage_meta
    return {"version": meta.version, "state_dict_metadata": entries, "storage_data": storage,
            "storage_meta": None if sm is None else {"checkpoint_id": None if sm.checkpoint_id is None else str(sm.checkpoint_id),
                                                     "save_id": sm.save_id, "modules": list(sm.modules)}}


def write_expected(path):
    with open(os.path.join(path, "expected.json"), "w") as f:
        json.dump(expected(path), f, indent=1, sort_keys=True)


def single(path):
    state = dict(values())
    state["bias"] = torch.nn.Parameter(state["bias"])  # recorded with requires_grad=True
    state["nested"] = {"inner": torch.arange(6, dtype=torch.int32).reshape(2, 3)}
    state["step"] = 7
    state["tag"] = "hello"
    state["history"] = [1, 2, 3]
    dcp.save(state, checkpoint_id=path, no_dist=True)
    write_expected(path)
    meta = FileSystemReader(path).read_metadata()
    for protocol in (2, 3, 5):
        with open(os.path.join(path, f"metadata_protocol_{protocol}.pickle"), "wb") as f:
            pickle.dump(meta, f, protocol=protocol)


def objects(path):
    state = {
        "lr": 0.05,
        "betas": (0.9, 0.999),
        "names": ["emb.weight", "head.weight"],
        "keyed": ({"x": -3, 2: None},),
        "flag": True,
        "nothing": None,
        "nested": [[1, 2.5], ("deep", [False])],
        "when": datetime.date(2026, 12, 2),
        "pair": (1, torch.ones(2)),
    }
    dcp.save(state, checkpoint_id=path, no_dist=True)
    write_expected(path)  # for the fuzz seeds: where each entry's bytes are


def chunk(offsets, sizes):
    return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))


def set_chunks(chunks):
    def edit(meta):
        meta.state_dict_metadata["w"].chunks = chunks
    return edit


def storage_of(meta, fqn):
    return next(info for index, info in meta.storage_data.items() if index.fqn == fqn)


def bad(single_path, out):
    """dcp_single's metadata, one field made wrong per file."""
    meta = FileSystemReader(single_path).read_metadata()
    cases = {
        "chunk_outside": set_chunks([chunk([0, 0], [8, 5])]),
        "chunks_overlap": set_chunks([chunk([0, 0], [4, 5]), chunk([3, 0], [4, 5])]),
        "chunks_gap": set_chunks([chunk([0, 0], [3, 5])]),
        "chunk_rank": set_chunks([chunk([0], [7])]),
        "path_escapes": lambda m: setattr(storage_of(m, "w"), "relative_path", "../escape.distcp"),
        "negative_offset": lambda m: setattr(storage_of(m, "w"), "offset", -1),
        "storage_missing": lambda m: m.storage_data.pop(next(i for i in m.storage_data if i.fqn == "step")),
        "storage_unknown": lambda m: m.storage_data.__setitem__(MetadataIndex("ghost"), copy.copy(storage_of(m, "step"))),
        "entry_not_metadata": lambda m: m.state_dict_metadata.__setitem__("w", [1, 2]),
        # One empty chunk 200000 times (pickled once, then by memo): refused in linear time.
        "many_empty_chunks": lambda m: m.state_dict_metadata.__setitem__("w", TensorStorageMetadata(
            m.state_dict_metadata["w"].properties, torch.Size([10, 0]), [chunk([0, 0], [10, 0])] * 200000)),
    }
    for name, edit in cases.items():
        m = copy.deepcopy(meta)
        edit(m)
        with open(os.path.join(out, name + ".metadata"), "wb") as f:
            pickle.dump(m, f)


class _Storage:
    """What BINPERSID refers to: the persistent id torch.save gives a storage."""
    def __init__(self, pid):
        self.pid = pid


class _Rebuild:
    """A tensor as torch.save pickles it: REDUCE of the rebuild function on its arguments."""
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


class _ItemPickler(pickle.Pickler):
    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, _Storage) else None


def write_item(path, record, storage_cls=torch.FloatStorage, numel=6, size=(2, 3), stride=(3, 1), offset=0, key="0",
               hooks=None, v3_dtype=None, truncate=False):
    """A torch.save-like zip of data.pkl (protocol 2, as torch.save) and the storage's record data/0."""
    storage = _Storage(("storage", storage_cls, key, "cpu", numel))
    hooks = collections.OrderedDict() if hooks is None else hooks
    if v3_dtype is None:
        tensor = _Rebuild(torch._utils._rebuild_tensor_v2, (storage, offset, tuple(size), stride, False, hooks))
    else:
        tensor = _Rebuild(torch._utils._rebuild_tensor_v3, (storage, offset, tuple(size), stride, False, hooks, v3_dtype))
    buffer = io.BytesIO()
    _ItemPickler(buffer, protocol=2).dump(tensor)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buffer.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
        z.writestr("archive/data/0", record)
    data = out.getvalue()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2] if truncate else data)


def shared_value_item(path):
    """A bytes entry whose list refers to one 400 KB string 200000 times (BINGET, 2 bytes each): a reader
    that copied the string per reference would need 80 GB."""
    text = "x" * 400000
    buffer = io.BytesIO()
    pickle.Pickler(buffer, protocol=2).dump([text] * 200000)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buffer.getvalue())
        z.writestr("archive/byteorder", "little")


def bad_items(out):
    floats = torch.arange(6, dtype=torch.float32).numpy().tobytes()
    # 0..5 as [2, 3] with stride (1, 2): the storage holds its transpose, row-major.
    transposed = torch.arange(6, dtype=torch.float32).reshape(2, 3).t().contiguous().numpy().tobytes()
    cases = {
        "good": {},
        "transposed": {"stride": (1, 2)},
        "v3": {"storage_cls": torch.storage.UntypedStorage, "numel": 24, "v3_dtype": torch.float32},
        "storage_too_small": {"offset": 1},
        "record_size": {"numel": 7},
        "wrong_dtype": {"storage_cls": torch.DoubleStorage, "record": torch.arange(6, dtype=torch.float64).numpy().tobytes()},
        "wrong_size": {"size": (3, 2), "stride": (2, 1)},
        "evil_global": {"storage_cls": os.system},
        "missing_record": {"key": "1"},
        "hooks": {"hooks": collections.OrderedDict(a=1)},
        "truncated": {"truncate": True},
    }
    for name, kwargs in cases.items():
        record = kwargs.pop("record", transposed if name == "transposed" else floats)
        write_item(os.path.join(out, name + ".item"), record, **kwargs)
    shared_value_item(os.path.join(out, "shared_string.item"))


def sharded_rank(rank, world_size, path, init_file):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world_size)
    mesh = init_device_mesh("cpu", (2, 2))
    t = values()
    state = {
        "w": distribute_tensor(t["w"], mesh, [Shard(0), Shard(1)]),
        "emb.weight": distribute_tensor(t["emb.weight"], mesh, [Shard(1), Shard(0)]),
        "bias": distribute_tensor(t["bias"], mesh, [Replicate(), Shard(0)]),
        "counts": distribute_tensor(t["counts"], mesh, [Replicate(), Replicate()]),
        "scale": t["scale"],
        "mask": t["mask"],
        "step": 11,
        "tag": "sharded",
    }
    dcp.save(state, checkpoint_id=path)
    dist.barrier()
    if rank == 0:
        write_expected(path)
    dist.barrier()
    dist.destroy_process_group()


def main(out):
    torch.set_num_threads(1)
    single(fresh(os.path.join(out, "dcp_single")))
    bad(os.path.join(out, "dcp_single"), fresh(os.path.join(out, "dcp_bad")))
    objects(fresh(os.path.join(out, "dcp_objects")))
    bad_items(fresh(os.path.join(out, "dcp_bad_items")))
    init_file = os.path.join(tempfile.mkdtemp(), "init")
    mp.spawn(sharded_rank, args=(4, fresh(os.path.join(out, "dcp_sharded")), init_file), nprocs=4, join=True)
    with open(os.path.join(out, "done"), "w") as f:
        f.write("ok\n")


if __name__ == "__main__":
    main(sys.argv[1])
