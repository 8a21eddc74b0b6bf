"""Point-to-point round trip of PyTorch's own gloo (Debian's python3-torch) on this machine, two
processes on loopback, one thread each: the reference for what one message between pipeline
stages costs here. Prints the median and the mean round trip in seconds of ROUNDS send/recv
pairs of a tensor of NUMEL float32s (after as many warm-up rounds): a pipeline's critical path
pays every message, so the mean (the tail of a loaded machine included) is what adds up.
Usage: pytorch_pingpong.py NUMEL ROUNDS
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, store, numel, rounds, result):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    tensor = torch.zeros(numel)
    times = []
    for _ in range(2 * rounds):
        start = time.perf_counter()
        if rank == 0:
            dist.send(tensor, 1)
            dist.recv(tensor, 1)
        else:
            dist.recv(tensor, 0)
            dist.send(tensor, 0)
        times.append(time.perf_counter() - start)
    if rank == 0:
        timed = sorted(times[rounds:])
        result[0] = timed[len(timed) // 2]
        result[1] = sum(timed) / len(timed)
    dist.destroy_process_group()


def main():
    numel, rounds = int(sys.argv[1]), int(sys.argv[2])
    store = os.path.join(tempfile.mkdtemp(prefix="gradhub-pingpong-"), "store")
    result = mp.Array("d", 2)
    ranks = [mp.Process(target=run, args=(r, store, numel, rounds, result)) for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join()
    if any(p.exitcode != 0 for p in ranks):
        sys.exit("a rank failed")
    print(f"{result[0]:.6f} {result[1]:.6f}")


if __name__ == "__main__":
    main()
