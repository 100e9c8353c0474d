#!/usr/bin/env python3
"""Compiles per-rank programs that dtensor saved (graph::save_program with sample inputs) ahead of time
with AOTInductor, one package per program, for graph::CompiledProgram to run from C++ with no Python.

    python scripts/compile_rank_programs.py --threads N [--jobs J] [--cache DIR] --out OUT_DIR PROGRAM.pt2 [PROGRAM.pt2 ...]

Programs compile J at a time (default: one per CPU), each in a process of its own: most of a compile is
the C++ compiler building one package, a single-threaded process.

Each OUT_DIR/<name>.pt2 records, under the metadata key "dtensor" (JSON), what it was built for: the
program's extra/dtensor.json (rank, mesh, the process groups its collectives name, each user input's
dtype and sizes), the thread count its kernels were specialised for (N), and the CPU flags of this
machine (the kernels are built with -march=native).
CompiledProgram refuses a package whose record does not match where it runs.

With --cache DIR (the tests and benchmarks pass ~/.cache/dtensor/compiled_programs), each package is
also kept there under a key of what it depends on: the program's bytes (save_program writes the same
bytes for the same program), this script, the torch version, the thread count and this machine's CPU
flags. A program met again is copied from there instead of compiled; the most recently used packages
are kept (DTENSOR_COMPILED_CACHE_KEEP, default 96).

Set TORCHINDUCTOR_CACHE_DIR to keep Inductor's cache between runs (./dev and the tests put it under
~/.cache/dtensor/inductor): a warm cache compiles the GPT demo's rank program in ~11 s instead of ~28 s.
"""
import argparse
import atexit
import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import zipfile

import torch

try:  # saved Hugging Face programs name its output types, which torch.export.load must know (pytree)
    import transformers.modeling_outputs  # noqa: F401
except ImportError:
    pass


def cpu_flags():
    """This machine's CPU flags, as /proc/cpuinfo lists them (CompiledProgram reads the same line)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return sorted(set(line.split(":", 1)[1].split()))
    sys.exit("compile_rank_programs: /proc/cpuinfo lists no CPU flags")


def rank_record(path):
    """The program's extra/dtensor.json (save_program writes it for per-rank programs)."""
    with zipfile.ZipFile(path) as archive:
        names = [n for n in archive.namelist() if n.endswith("/extra/dtensor.json")]
        if len(names) != 1:
            sys.exit(f"{path}: not a per-rank program saved by dtensor (no extra/dtensor.json)")
        return json.loads(archive.read(names[0]))


def compile_one(path, out_dir, threads):
    start = time.time()
    record = rank_record(path)
    ep = torch.export.load(path)
    if not ep.example_inputs:
        sys.exit(f"{path}: saved without sample inputs (graph::save_program(..., {{.sample_inputs = ...}}))")
    record["threads"] = threads
    record["cpu_flags"] = cpu_flags()
    target = os.path.join(out_dir, os.path.basename(path))
    torch._inductor.aoti_compile_and_package(
        ep, package_path=target,
        inductor_configs={"cpp.threads": threads, "aot_inductor.metadata": {"dtensor": json.dumps(record)},
                          # Inductor would write small parameters (a bias of 8) into the code as literal
                          # values, out of reach of CompiledProgram::use_state_of and an optimizer.
                          "always_keep_tensor_constants": True})
    print(f"compiled {path} -> {target} (rank {record['rank']}, {time.time() - start:.1f} s)", flush=True)


def cache_key(path, threads):
    """What a package depends on, hashed: the program's bytes, this script, the torch version, the thread
    count and the CPU flags."""
    digest = hashlib.sha256()
    for name in (path, os.path.abspath(__file__)):
        with open(name, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    digest.update(f"{torch.__version__}|{threads}|{' '.join(cpu_flags())}".encode())
    return digest.hexdigest()[:32]


def from_cache(programs, cache, out_dir, threads):
    """Copies the packages the cache holds into out_dir; returns the programs still to compile, with
    their keys."""
    todo = []
    for path in programs:
        key = cache_key(path, threads)
        kept = os.path.join(cache, key + ".pt2")
        if os.path.exists(kept):
            os.utime(kept)
            shutil.copyfile(kept, os.path.join(out_dir, os.path.basename(path)))
            print(f"{path}: compiled by an earlier run ({kept})", flush=True)
        else:
            todo.append((path, key))
    return todo


def into_cache(compiled, cache, out_dir):
    """Keeps the packages just compiled under their keys (written whole, then renamed), and the most
    recently used ones only."""
    for path, key in compiled:
        staging = tempfile.NamedTemporaryFile(dir=cache, prefix=".staging.", delete=False)
        staging.close()
        shutil.copyfile(os.path.join(out_dir, os.path.basename(path)), staging.name)
        os.replace(staging.name, os.path.join(cache, key + ".pt2"))
    keep = int(os.environ.get("DTENSOR_COMPILED_CACHE_KEEP", "96"))
    kept = sorted((os.path.join(cache, f) for f in os.listdir(cache) if f.endswith(".pt2")), key=os.path.getmtime, reverse=True)
    for old in kept[keep:]:
        os.remove(old)


def start_worker(worker_numbers, threads):
    """A compiling process: its own Inductor cache directory, as Inductor's files are not safe to share between
    processes compiling at once. Ranks of one program generate the same code, so two workers wrote the same
    cache entry at once and one package got the other's half-written metadata."""
    torch.set_num_threads(threads)
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    number = worker_numbers.get()
    if base:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, f"worker{number}")
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"compile_rank_programs_worker{number}_")
        atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, required=True, help="intra-op threads the program will run with")
    parser.add_argument("--out", required=True, help="directory for the packages")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="programs compiled at once (default: CPUs)")
    parser.add_argument("--cache", help="keep packages here by content, and reuse them")
    parser.add_argument("programs", nargs="+")
    args = parser.parse_args()
    if args.threads < 1:
        sys.exit("--threads must be at least 1")
    if args.jobs < 1:
        sys.exit("--jobs must be at least 1")
    os.makedirs(args.out, exist_ok=True)
    todo = [(path, None) for path in args.programs]
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
        todo = from_cache(args.programs, args.cache, args.out, args.threads)
    compile_all([path for path, _ in todo], args)
    if args.cache and todo:
        into_cache(todo, args.cache, args.out)


def compile_all(programs, args):
    if not programs:
        return
    if args.jobs == 1 or len(programs) == 1:
        torch.set_num_threads(args.threads)
        for path in programs:
            compile_one(path, args.out, args.threads)
        return
    # Fresh interpreters (spawn), not forks of this one: torch's thread pools do not survive a fork.
    context = multiprocessing.get_context("spawn")
    worker_numbers = context.Queue()
    for number in range(args.jobs):
        worker_numbers.put(number)
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(args.jobs, len(programs)), mp_context=context,
                                                initializer=start_worker,
                                                initargs=(worker_numbers, args.threads)) as pool:
        for done in [pool.submit(compile_one, path, args.out, args.threads) for path in programs]:
            done.result()  # the first failure (compile_one exits with its message) ends the run


if __name__ == "__main__":
    main()
