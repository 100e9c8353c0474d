"""Local ranks for the benchmarks' PyTorch baselines: processes on this machine that meet on loopback."""
import socket

import torch.multiprocessing as mp


def spawn(run, ranks, args):
    """Runs run(rank, ranks, args, port) in `ranks` processes; `port` is a free one for their rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(ranks, args, port), nprocs=ranks)
