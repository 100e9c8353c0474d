#!/usr/bin/env python3
"""Compiles per-rank programs that dtensor saved (graph::save_program with sample inputs) ahead of time
with AOTInductor, one package per program, for graph::CompiledProgram to run from C++ with no Python.

    python scripts/compile_rank_programs.py --threads N [--jobs J] --out OUT_DIR PROGRAM.pt2 [PROGRAM.pt2 ...]

Programs compile J at a time (default: one per CPU), each in a process of its own: most of a compile is
the C++ compiler building one package, a single-threaded process.

Each OUT_DIR/<name>.pt2 records, under the metadata key "dtensor" (JSON), what it was built for: the
program's extra/dtensor.json (rank, mesh, the process groups its collectives name, each user input's
dtype and sizes), the thread count its kernels were specialised for (N), and the CPU flags of this
machine (the kernels are built with -march=native).
CompiledProgram refuses a package whose record does not match where it runs.

Set TORCHINDUCTOR_CACHE_DIR to keep Inductor's cache between runs (./dev and the tests put it under
~/.cache/dtensor/inductor): a warm cache compiles the GPT demo's rank program in ~11 s instead of ~28 s.
"""
import argparse
import atexit
import concurrent.futures
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import zipfile

import torch


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
    parser.add_argument("programs", nargs="+")
    args = parser.parse_args()
    if args.threads < 1:
        sys.exit("--threads must be at least 1")
    if args.jobs < 1:
        sys.exit("--jobs must be at least 1")
    os.makedirs(args.out, exist_ok=True)
    if args.jobs == 1 or len(args.programs) == 1:
        torch.set_num_threads(args.threads)
        for path in args.programs:
            compile_one(path, args.out, args.threads)
        return
    # Fresh interpreters (spawn), not forks of this one: torch's thread pools do not survive a fork.
    context = multiprocessing.get_context("spawn")
    worker_numbers = context.Queue()
    for number in range(args.jobs):
        worker_numbers.put(number)
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(args.jobs, len(args.programs)), mp_context=context,
                                                initializer=start_worker,
                                                initargs=(worker_numbers, args.threads)) as pool:
        for done in [pool.submit(compile_one, path, args.out, args.threads) for path in args.programs]:
            done.result()  # the first failure (compile_one exits with its message) ends the run


if __name__ == "__main__":
    main()
