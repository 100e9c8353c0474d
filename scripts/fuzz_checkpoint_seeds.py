"""Seeds for fuzz/checkpoint_fuzzer.cpp: the checkpoints PyTorch wrote at build time, packed as that
target reads its input (the index, then each safetensors file, joined by SEPARATOR), plus one in
dtensor's own layout (dtensor metadata and index section on DCP's sharded files).

  fuzz_checkpoint_seeds.py PYTORCH_WRITTEN OUT_DIR
"""
import json
import os
import struct
import sys

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


def main(written, out_dir):
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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
