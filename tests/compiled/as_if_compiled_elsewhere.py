#!/usr/bin/env python3
"""A copy of a compiled package as if built on a machine whose CPU has one more instruction set
extension (dtensor_test_only_isa) than this one: its dtensor metadata's cpu_flags gain that flag, the
code is unchanged. CompiledProgram must refuse it before loading the code.

    python tests/compiled/as_if_compiled_elsewhere.py PACKAGE.pt2 COPY.pt2
"""
import json
import os
import sys
import zipfile


def main(source, target):
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    rewritten = 0
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("_metadata.json"):
                metadata = json.loads(data)
                record = json.loads(metadata["dtensor"])
                record["cpu_flags"].append("dtensor_test_only_isa")
                metadata["dtensor"] = json.dumps(record)
                data = json.dumps(metadata).encode()
                rewritten += 1
            dst.writestr(info.filename, data)
    if not rewritten:
        sys.exit(f"{source}: no metadata file to rewrite")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
