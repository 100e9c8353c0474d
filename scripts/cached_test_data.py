#!/usr/bin/env python3
"""Runs a script that writes the tests' data into a directory, or copies what an earlier run with the same
inputs wrote. The build runs the exports of scripts/ through it (CMakeLists.txt).

    python scripts/cached_test_data.py --name NAME --out DIR --key FILE [--key FILE ...] [--key-text TEXT ...] -- COMMAND...

COMMAND writes into the directory it is given where its arguments say {out}; what it wrote is then copied
into DIR (beside anything DIR already holds) and kept under a key of the --key files' bytes and the
--key-text strings (the scripts, the pinned Python packages, the torch version) in
~/.cache/dtensor/test_data (DTENSOR_TEST_DATA_CACHE), the last few keys per NAME only. Every new
build tree (a fresh clone, the sanitizer and fuzzing trees) would otherwise spend a minute of Python
exporting the same models again, and would write new random serialization ids into them, so that
nothing derived from them (compiled per-rank programs) could be reused either. The scripts are
deterministic (fixed seeds, one thread), so a copy is what a run would write.
"""
import argparse
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

KEEP_PER_NAME = 3


def cache_key(key_files, key_texts):
    digest = hashlib.sha256()
    for path in key_files:
        digest.update(os.path.basename(path).encode() + b"\0" + pathlib.Path(path).read_bytes() + b"\0")
    for text in key_texts:
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()[:32]


def copy_into(source, target):
    """Copies the tree `source` into `target` with fresh modification times (copy, not copy2), so that the
    build sees its outputs newer than the scripts that make them."""
    shutil.copytree(source, target, copy_function=shutil.copy, dirs_exist_ok=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="what the data is (its entries in the cache)")
    parser.add_argument("--out", required=True, help="the directory the data goes to")
    parser.add_argument("--key", action="append", default=[], help="a file whose bytes the data depends on")
    parser.add_argument("--key-text", action="append", default=[], help="a string the data depends on")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command, {out} for its directory")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not any("{out}" in word for word in command):
        sys.exit("cached_test_data: give the command after --, with {out} where it takes its output directory")

    out = pathlib.Path(args.out)
    name = args.name
    cache = pathlib.Path(os.environ.get("DTENSOR_TEST_DATA_CACHE") or pathlib.Path.home() / ".cache/dtensor/test_data")
    entry = cache / f"{name}-{cache_key(args.key, args.key_text)}"
    if entry.is_dir():
        copy_into(entry, out)
        entry.touch()
        print(f"cached_test_data: {out} from {entry} (written by an earlier run of the same scripts)")
        return

    cache.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
    try:
        subprocess.run([word.replace("{out}", str(staging)) for word in command], check=True)
        copy_into(staging, out)
        try:
            staging.rename(entry)
        except OSError:  # another build stored the same key first
            shutil.rmtree(staging)
    except subprocess.CalledProcessError as error:
        shutil.rmtree(staging, ignore_errors=True)
        sys.exit(error.returncode)
    for old in sorted(cache.glob(f"{name}-*"), key=lambda p: p.stat().st_mtime, reverse=True)[KEEP_PER_NAME:]:
        shutil.rmtree(old, ignore_errors=True)


if __name__ == "__main__":
    main()
