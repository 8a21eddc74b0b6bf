#!/usr/bin/python3
"""Step time of one training script under torch's DistributedDataParallel (gloo) and under
gradhub.DistributedDataParallel, ranks as processes on one host, one thread each.

Usage: python_ddp.py IMPL MODEL BATCH WORLD STEPS
  IMPL   pytorch      torch.distributed (gloo) + torch.nn.parallel.DistributedDataParallel
         gradhub      gradhub.distributed.init() + gradhub.DistributedDataParallel, allreduce
                      through shared memory (its default on one host)
         gradhub_tcp  the same with init(shared_memory=False): gloo over loopback TCP
  MODEL  an MLP's widths like 784-1024-1024-10 (the ddp bench's MLP, one definition in
         ../ddp/pytorch_ddp.py), or "cnn" (CNN below, 1x28x28 input)
Prints one line, as ../ddp/bench_ddp and pytorch_ddp.py do:
    <model> <world_size> <median step seconds>
A step is optimizer.zero_grad(), forward, cross-entropy loss, backward, SGD step (lr 0.01,
momentum 0.9), the same lines for both IMPLs: only the DDP class and the group's init differ,
as in a user's script. The first STEPS/5 steps are warm-up; the figure is rank 0's median over
the rest, the statistic of bench_ddp, against which run.sh sets it (python_overhead).

GRADHUB_BENCH_PROFILE=1 adds one line on stderr: rank 0's median seconds per phase (zero_grad,
forward with loss, backward, optimizer step) and, for gradhub, the Reducer's own time in
the last backward (last_reduction(): allreduce_seconds, wait_seconds).
"""
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ddp"))
from pytorch_ddp import build, sgd  # noqa: E402  (the ddp bench's MLP and optimizer)

IMPLS = ("pytorch", "gradhub", "gradhub_tcp")
PHASES = ("zero_grad", "forward", "backward", "step")


class Cnn(torch.nn.Module):
    """pytorch/examples' MNIST network without its dropout: two 3x3 convolutions, one 2x2 max
    pool, two linear layers; 1.2M parameters, 4.8 MB of gradients per step."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3)
        self.conv2 = torch.nn.Conv2d(32, 64, 3)
        self.fc1 = torch.nn.Linear(9216, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        x = torch.flatten(torch.nn.functional.max_pool2d(x, 2), 1)
        return self.fc2(torch.relu(self.fc1(x)))


def model_and_data(model, batch):
    """The module and one batch (inputs, labels); the same on every rank (seed 0)."""
    torch.manual_seed(0)
    if model == "cnn":
        return Cnn(), torch.randn(batch, 1, 28, 28), torch.randint(10, (batch,))
    widths = [int(w) for w in model.split("-")]
    return build(widths), torch.randn(batch, widths[0]), torch.randint(widths[-1], (batch,))


def wrap(impl, module, rank, world, init_file):
    """Joins the group and wraps `module` in the IMPL's DDP."""
    if impl == "pytorch":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                                world_size=world)
        return torch.nn.parallel.DistributedDataParallel(module)
    import gradhub.distributed
    gradhub.distributed.init("gloo", init_method="file://" + init_file, rank=rank,
                             world_size=world, shared_memory=(impl == "gradhub"))
    return gradhub.DistributedDataParallel(module)


def leave(impl):
    if impl == "pytorch":
        torch.distributed.destroy_process_group()
    else:
        import gradhub.distributed
        gradhub.distributed.destroy()


def train(model, optimizer, x, y, steps):
    """Runs `steps` steps; returns each step's seconds per phase (a list per PHASES entry)."""
    times = {phase: [] for phase in PHASES}
    for _ in range(steps):
        marks = [time.perf_counter()]
        optimizer.zero_grad()
        marks.append(time.perf_counter())
        loss = torch.nn.functional.cross_entropy(model(x), y)
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        optimizer.step()
        marks.append(time.perf_counter())
        for i, phase in enumerate(PHASES):
            times[phase].append(marks[i + 1] - marks[i])
    return times


def run(rank, impl, model_name, batch, world, steps, init_file, results):
    torch.set_num_threads(1)
    module, x, y = model_and_data(model_name, batch)
    model = wrap(impl, module, rank, world, init_file)
    times = train(model, sgd(model.parameters()), x, y, steps)
    if rank == 0:
        warm = steps // 5
        totals = [sum(parts) for parts in zip(*(times[p][warm:] for p in PHASES))]
        phases = {p: statistics.median(times[p][warm:]) for p in PHASES}
        if impl != "pytorch":
            phases.update(model.last_reduction())
        results.put((statistics.median(totals), phases))
    leave(impl)


def parse(argv):
    """(impl, model, batch, world, steps); ValueError naming the bad argument."""
    if len(argv) != 6:
        raise ValueError("usage: python_ddp.py IMPL MODEL BATCH WORLD STEPS")
    impl, model = argv[1], argv[2]
    if impl not in IMPLS:
        raise ValueError(f"IMPL: '{impl}' is none of {', '.join(IMPLS)}")
    if model != "cnn" and not all(w.isdigit() for w in model.split("-")):
        raise ValueError(f"MODEL: '{model}' is neither cnn nor widths like 784-1024-10")
    numbers = []
    for name, text in (("BATCH", argv[3]), ("WORLD", argv[4]), ("STEPS", argv[5])):
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{name}: '{text}' is not a positive integer")
        numbers.append(int(text))
    if numbers[2] < 5:
        raise ValueError(f"STEPS: {numbers[2]} leaves no timed step after the warm-up (>= 5)")
    return (impl, model, *numbers)


def main():
    try:
        impl, model, batch, world, steps = parse(sys.argv)
    except ValueError as error:
        sys.exit(f"python_ddp.py: {error}")
    scratch = tempfile.mkdtemp(prefix="gradhub-bench-pyddp-")
    results = mp.get_context("spawn").Queue()
    try:
        mp.start_processes(run, args=(impl, model, batch, world, steps,
                                      os.path.join(scratch, "init"), results),
                           nprocs=world, start_method="spawn")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    median, phases = results.get()
    if os.environ.get("GRADHUB_BENCH_PROFILE") == "1":
        print(impl, model, world, " ".join(f"{k}={v:.6f}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in phases.items()), file=sys.stderr)
    print(model, world, f"{median:.6f}")


if __name__ == "__main__":
    main()
