#!/usr/bin/python3
"""Reference for bench_ddp: PyTorch DDP (Debian's python3-torch, gloo backend) on the same
models, batch sizes, optimizer and thread count. Prints one line per configuration:
    <model> <world_size> <median step seconds>
Usage: pytorch_ddp.py MODEL BATCH WORLD STEPS   (MODEL like 784-1024-1024-10)
"""
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def build(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def run(rank, world, widths, batch, steps, init_file, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build(widths))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, widths[0])
    y = torch.randint(widths[-1], (batch,))
    times = []
    for step in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    if rank == 0:
        results.put(statistics.median(times[steps // 5:]))
    dist.destroy_process_group()


def main():
    widths = [int(w) for w in sys.argv[1].split("-")]
    batch, world, steps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    init_file = os.path.join(tempfile.mkdtemp(), "init")
    results = mp.get_context("spawn").Queue()
    mp.start_processes(run, args=(world, widths, batch, steps, init_file, results),
                       nprocs=world, start_method="spawn")
    print(sys.argv[1], world, f"{results.get():.6f}")


if __name__ == "__main__":
    main()
