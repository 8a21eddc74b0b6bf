#!/usr/bin/python3
"""Reference for bench_ddp: PyTorch DDP (Debian's python3-torch, gloo backend) on the same
models, batch sizes, optimizer and thread count. Prints one line per configuration:
    <model> <world_size> <median step seconds>
Usage: pytorch_ddp.py MODEL BATCH WORLD STEPS [MODE]   (MODEL like 784-1024-1024-10)
MODE as bench_ddp's, each with PyTorch's own: plain, bf16 (torch.autocast("cpu",
bfloat16)), zero (ZeroRedundancyOptimizer), localsgd8 (post_localSGD_hook with a subgroup of
one rank each, so local steps send nothing, and PostLocalSGDOptimizer with a
PeriodicModelAverager, period 8, warm-up 2), powersgd4 (powerSGD_hook, rank 4, from step 2).
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


def sgd(parameters):
    return torch.optim.SGD(parameters, lr=0.01, momentum=0.9)


def optimizer_for(mode, model):
    if mode == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                       lr=0.01, momentum=0.9)
    if mode == "localsgd8":
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as local
        from torch.distributed.algorithms.model_averaging import averagers
        from torch.distributed.optim import PostLocalSGDOptimizer
        # new_subgroups needs CUDA in 1.13: one group per rank, each made by every rank.
        subgroup = [dist.new_group(ranks=[r]) for r in range(dist.get_world_size())][dist.get_rank()]
        model.register_comm_hook(local.PostLocalSGDState(process_group=None, subgroup=subgroup,
                                                         start_localSGD_iter=2),
                                 local.post_localSGD_hook)
        return PostLocalSGDOptimizer(optim=sgd(model.parameters()),
                                     averager=averagers.PeriodicModelAverager(period=8,
                                                                              warmup_steps=2))
    if mode == "powersgd4":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

        # On gloo (1.13), powerSGD_hook launches each bucket's next allreduce from a future's
        # callback on a gloo thread, so two buckets' collectives interleave differently on
        # different ranks and gloo aborts ("op.preamble.length <= op.nbytes"). Waiting for
        # each bucket inside the hook keeps one order (and gives up the overlap).
        def serialized_powersgd(state, bucket):
            reduced = powersgd.powerSGD_hook(state, bucket).wait()
            done = torch.futures.Future()
            done.set_result(reduced)
            return done

        model.register_comm_hook(powersgd.PowerSGDState(process_group=None,
                                                        matrix_approximation_rank=4,
                                                        start_powerSGD_iter=2),
                                 serialized_powersgd)
    elif mode not in ("plain", "bf16"):
        raise ValueError("unknown mode " + mode)
    return sgd(model.parameters())


def run(rank, world, widths, batch, steps, init_file, results, mode):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build(widths))
    optimizer = optimizer_for(mode, model)
    x = torch.randn(batch, widths[0])
    y = torch.randint(widths[-1], (batch,))
    times = []
    for step in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "bf16")):
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
    mode = sys.argv[5] if len(sys.argv) > 5 else "plain"
    init_file = os.path.join(tempfile.mkdtemp(), "init")
    results = mp.get_context("spawn").Queue()
    mp.start_processes(run, args=(world, widths, batch, steps, init_file, results, mode),
                       nprocs=world, start_method="spawn")
    print(sys.argv[1], world, f"{results.get():.6f}")


if __name__ == "__main__":
    main()
