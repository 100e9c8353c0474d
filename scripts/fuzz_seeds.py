"""Seeds for the fuzz targets (fuzz/), from the suite's own files, one directory per target:

  fuzz_seeds.py GRAPH_MODELS PYTORCH_WRITTEN OUT_DIR [DCP_WRITTEN]

  OUT_DIR/pt2/         the exported archives as they are
  OUT/pt2_graph/       per archive (in name order): its index as one byte, then its models/model.json
  OUT/checkpoint/      the checkpoints PyTorch wrote, packed as checkpoint_fuzzer reads its input (the
                       index, then each safetensors file, joined by SEPARATOR), plus one in dtensor's
                       own layout (dtensor metadata and index section on DCP's sharded files)
  OUT/dcp_metadata/    the DCP .metadata pickles scripts/write_dcp_checkpoints.py wrote into DCP_WRITTEN
                       (dcp.save's, the same re-pickled at protocols 2, 3 and 5, the damaged copies)
  OUT/dcp_item/        items (torch.save'd zips): DCP_WRITTEN's dcp_bad_items/*.item (all but the large
                       shared_string.item) and every item of the one-process saves dcp_single and
                       dcp_objects (tensors and bytes entries), cut out of their .distcp files by their
                       expected.json
"""
import glob
import json
import os
import shutil
import struct
import sys
import zipfile

SEPARATOR = b"\n--dtensor-fuzz-next-file--\n"  # as in fuzz/checkpoint_fuzzer.cpp
INDEX = "model.safetensors.index.json"


def read(path):
    with open(path, "rb") as f:
        return f.read()


def pack(out_dir, name, index, files):
    with open(os.path.join(out_dir, name), "wb") as f:
        f.write(SEPARATOR.join([index] + files))


def header_of(data):
    """A safetensors file's header (as a dict) and where its data starts."""
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + length]), 8 + length


def with_metadata(data, extra):
    """A safetensors file with `extra` added to its __metadata__ (header re-padded with spaces)."""
    header, start = header_of(data)
    header.setdefault("__metadata__", {}).update(extra)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[start:]


def tensors_of(data):
    return {k: v for k, v in header_of(data)[0].items() if k != "__metadata__"}


def graph_seeds(models, out_dir):
    os.makedirs(os.path.join(out_dir, "pt2"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "pt2_graph"), exist_ok=True)
    for index, path in enumerate(sorted(glob.glob(os.path.join(models, "*.pt2")))):  # as fuzz/pt2_graph_fuzzer.cpp orders them
        shutil.copy(path, os.path.join(out_dir, "pt2"))
        with zipfile.ZipFile(path) as z:
            model = next(n for n in z.namelist() if n.endswith("/models/model.json"))
            with open(os.path.join(out_dir, "pt2_graph", os.path.basename(path)), "wb") as f:
                f.write(bytes([index]) + z.read(model))


def checkpoint_seeds(written, out_dir):
    out_dir = os.path.join(out_dir, "checkpoint")
    os.makedirs(out_dir, exist_ok=True)
    for name in ("save_file", "hf_index", "dcp_whole", "dcp_sharded"):
        d = os.path.join(written, name)
        index = read(os.path.join(d, INDEX)) if os.path.exists(os.path.join(d, INDEX)) else b""
        files = [read(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith(".safetensors")]
        pack(out_dir, name, index, files)

    # dtensor's layout: every file records its tensors' global shapes, the index lists the files.
    d = os.path.join(written, "dcp_sharded")
    shards = [read(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith(".safetensors")]
    global_shapes = {}
    for data in shards:
        info = json.loads(header_of(data)[0]["__metadata__"]["DCP_SHARDING_INFO"])
        for tensor, t in tensors_of(data).items():
            ends = [o + s for o, s in zip(info[tensor]["saved_offsets"], t["shape"])]
            global_shapes[tensor] = [max(a, b) for a, b in zip(global_shapes.get(tensor, ends), ends)]
    files = []
    for data in shards:
        mine = {t: global_shapes[t] for t in tensors_of(data)}
        files.append(with_metadata(data, {"dtensor": json.dumps({"version": 1, "global_shapes": mine})}))
    names = [f"model-{k + 1:05d}-of-{len(files):05d}.safetensors" for k in range(len(files))]
    index = {"metadata": {}, "weight_map": {}, "dtensor": {"version": 1, "world_size": len(files), "files": names,
                                                           "tensors": sorted(global_shapes)}}
    pack(out_dir, "dtensor_sharded", json.dumps(index).encode(), files)


def dcp_metadata_seeds(written, out_dir):
    out_dir = os.path.join(out_dir, "dcp_metadata")
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(written, d, ".metadata") for d in ("dcp_single", "dcp_sharded")]
    paths += sorted(glob.glob(os.path.join(written, "dcp_single", "*.pickle")))
    paths += sorted(glob.glob(os.path.join(written, "dcp_bad", "*.metadata")))
    for path in paths:
        name = os.path.relpath(path, written).replace(os.sep, "_")
        shutil.copy(path, os.path.join(out_dir, name))


def dcp_item_seeds(written, out_dir):
    out_dir = os.path.join(out_dir, "dcp_item")
    os.makedirs(out_dir, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(written, "dcp_bad_items", "*.item"))):
        # Not shared_string.item: 800 KB read as 200000 list entries per execution would slow the whole
        # target eightfold; the memory regression it guards is a unit test (DcpObjects.Shares...).
        if os.path.basename(path) != "shared_string.item":
            shutil.copy(path, out_dir)
    for name in ("dcp_single", "dcp_objects"):
        d = os.path.join(written, name)
        with open(os.path.join(d, "expected.json")) as f:
            storage = json.load(f)["storage_data"]
        for i, item in enumerate(storage):  # tensor items and bytes entries
            data = read(os.path.join(d, item["relative_path"]))[item["file_offset"]:item["file_offset"] + item["length"]]
            with open(os.path.join(out_dir, "%s_%d.item" % (name, i)), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    graph_seeds(sys.argv[1], sys.argv[3])
    checkpoint_seeds(sys.argv[2], sys.argv[3])
    if len(sys.argv) > 4:
        dcp_metadata_seeds(sys.argv[4], sys.argv[3])
        dcp_item_seeds(sys.argv[4], sys.argv[3])
