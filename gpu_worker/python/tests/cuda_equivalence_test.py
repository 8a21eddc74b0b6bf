"""gradhub.DistributedDataParallel against torch's on CUDA with NCCL (issue 32's acceptance on
GPUs; tests/gpu/run.sh runs it on a GPU node, and it skips wherever torch has no CUDA):
  - world 1: one rank on cuda:0;
  - world 2: ranks on cuda:0 and cuda:1, when two GPUs are visible.
Each rank trains the same MLP from the same seed on its own batches for STEPS steps, first
under torch's DDP (torch.distributed's NCCL), then under gradhub's (gradhub.distributed's
NCCL, the C++ Reducer); every parameter must end within TOLERANCE of torch's, the ranks must
agree exactly, and training must have moved the parameters at all.

Runs under pytest, or alone where pytest is not installed (a CUDA wheel's environment):
    python3 cuda_equivalence_test.py [test_name ...]
prints one line per case, "PASS|SKIP|FAIL <name>: <figures or reason>", and exits 0 only if
none failed. torch is imported inside the functions, so collecting this file here costs
nothing and leaves the process without torch.
"""

import sys
import traceback
import unittest

import rank_processes

STEPS = 100
TOLERANCE = 1e-6
FEATURES, HIDDEN, CLASSES, BATCH = 32, 512, 4, 16
# The MLP's 2.2 MB of gradients in buckets of 256 KiB after the first (1 MiB): several, so
# the order of bucket launches and their overlap with backward are part of what must agree.
BUCKET_CAP_MB = 0.25


def _require_gpus(world):
    import torch
    if not torch.cuda.is_available():
        raise unittest.SkipTest("this torch has no CUDA")
    if torch.cuda.device_count() < world:
        raise unittest.SkipTest(f"world {world} needs {world} GPUs, "
                                f"{torch.cuda.device_count()} visible")


def _model(device):
    import torch
    torch.manual_seed(7)
    layers = [torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU()]
    for _ in range(2):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, CLASSES)).to(device)


def _train(wrapped, model, rank, device):
    """STEPS steps of SGD with momentum on rank `rank`'s batches (made on the CPU from a
    seed, so both runs see the same bytes); the parameters at the end, on the CPU."""
    import torch
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(BATCH, FEATURES, generator=generator).to(device)
        y = torch.randint(0, CLASSES, (BATCH,), generator=generator).to(device)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(wrapped(x), y).backward()
        optimizer.step()
    torch.cuda.synchronize(device)
    return [parameter.detach().cpu().clone() for parameter in model.parameters()]


def train_both(rank, world, torch_port, gradhub_port):
    """One rank: {"initial", "torch", "gradhub"}, each the list of parameters."""
    import torch
    import torch.distributed
    import gradhub
    import gradhub.distributed
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    initial = [p.detach().cpu().clone() for p in _model(device).parameters()]

    torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{torch_port}",
                                         rank=rank, world_size=world)
    model = _model(device)
    wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank],
                                                        bucket_cap_mb=BUCKET_CAP_MB)
    theirs = _train(wrapped, model, rank, device)
    torch.distributed.destroy_process_group()

    group = gradhub.distributed.init("nccl", init_method=f"tcp://127.0.0.1:{gradhub_port}",
                                     rank=rank, world_size=world, device=rank)
    assert group.backend == gradhub.distributed.Backend.NCCL, group.backend
    model = _model(device)
    wrapped = gradhub.DistributedDataParallel(model, device_ids=[rank], bucket_cap_mb=BUCKET_CAP_MB)
    assert len(wrapped.bucket_assignment()) > 1, wrapped.bucket_assignment()
    ours = _train(wrapped, model, rank, device)
    gradhub.distributed.destroy()
    return {"initial": initial, "torch": theirs, "gradhub": ours}


def _max_difference(a, b):
    return max(float(abs(x - y).max()) for x, y in zip(a, b))


def _check(world):
    """Runs train_both on `world` GPUs and checks its results; the figures for the report."""
    _require_gpus(world)
    results = rank_processes.run(world, train_both, rank_processes.free_port(),
                                 rank_processes.free_port())
    first = results[0]
    moved = _max_difference(first["gradhub"], first["initial"])
    assert moved > 1e-3, f"the parameters barely moved in {STEPS} steps ({moved:.3g})"
    for rank, result in enumerate(results[1:], start=1):
        apart = _max_difference(result["gradhub"], first["gradhub"])
        assert apart == 0.0, f"gradhub's rank {rank} differs from rank 0 by {apart:.3g}"
    difference = _max_difference(first["gradhub"], first["torch"])
    assert difference <= TOLERANCE, (
        f"after {STEPS} steps a parameter of gradhub's DDP is {difference:.3g} from torch's "
        f"(tolerance {TOLERANCE})")
    # No "|" in it: tests/gpu/run.sh's table splits its rows there.
    return f"max abs(gradhub - torch) {difference:.3g} after {STEPS} steps"


def test_world_1_on_cuda0_matches_torch_ddp():
    _check(1)


def test_world_2_on_two_gpus_matches_torch_ddp():
    _check(2)


def _main(names):
    cases = {"test_world_1_on_cuda0_matches_torch_ddp": 1,
             "test_world_2_on_two_gpus_matches_torch_ddp": 2}
    failed = 0
    for name in names or cases:
        try:
            print(f"PASS {name}: {_check(cases[name])}", flush=True)
        except unittest.SkipTest as skip:
            print(f"SKIP {name}: {skip}", flush=True)
        except Exception as error:  # noqa: B902 - every failure is reported, then counted
            traceback.print_exc()
            summary = " / ".join(str(error).splitlines()[:2]) or repr(error)
            print(f"FAIL {name}: {summary}", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
