"""A rank that dies never hangs the others (issue 32's acceptance): world 3, rank 2 kills
itself with SIGKILL while ranks 0 and 1 are inside an allreduce, a direct one or the
buckets' of a DDP backward; the survivors raise within the collective timeout, and the
message names the operation, the group and the rank. Also a rendezvous a rank never joins.

The survivors tell rank 2 through a semaphore that they are inside the collective, so it
dies at that moment and not before, whatever the load on the machine. init()'s timeout (the
collective timeout) also bounds the rendezvous, so the ranks first wait for each other on a
multiprocessing barrier: interpreters that start seconds apart still meet within it."""

import os
import signal
import time

import pytest
import torch
import torch.nn.functional as F

import gradhub
import gradhub.distributed as dist
import rank_processes

WORLD = 3
VICTIM = WORLD - 1
COLLECTIVE_TIMEOUT_S = 8.0
# What the machine may add to a timeout: scheduling on a loaded 2-core machine.
SLACK_S = 5.0
STARTUP_S = 180.0


def _init_together(rank, world, init_method, sync, **options):
    together, _ = sync
    together.wait(STARTUP_S)
    return dist.init("gloo", init_method=init_method, rank=rank, world_size=world,
                     timeout=COLLECTIVE_TIMEOUT_S, **options)


def _sync():
    """(a barrier every rank passes before init(), the survivors' "inside" semaphore)."""
    return rank_processes.context().Barrier(WORLD), rank_processes.context().Semaphore(0)


def _die_once_survivors_are_in(sync):
    _, inside = sync
    for _ in range(WORLD - 1):
        assert inside.acquire(timeout=STARTUP_S), "the survivors never entered the collective"
    time.sleep(0.2)  # let them block in it
    os.kill(os.getpid(), signal.SIGKILL)


def _raised_within(call):
    """(type name, message, seconds) of what call() raised; AssertionError if it returned."""
    start = time.monotonic()
    try:
        call()
    except Exception as error:  # noqa: B902 - compared by the test
        return type(error).__name__, str(error), time.monotonic() - start
    raise AssertionError("returned although a peer died")


def _all_reduce_rank(rank, world, init_method, shared_memory, sync):
    group = _init_together(rank, world, init_method, sync, name="failure-test",
                           shared_memory=shared_memory)
    tensor = torch.ones(4 * 1024 * 1024)
    group.all_reduce(tensor).wait()  # every rank is up and connected
    if rank == VICTIM:
        _die_once_survivors_are_in(sync)
    work = group.all_reduce(tensor)
    sync[1].release()
    return _raised_within(work.wait)


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shared-memory", "tcp"])
def test_survivors_of_a_killed_peer_raise_collective_error(tmp_path, shared_memory):
    init_method = f"file://{tmp_path}/rendezvous"
    results = rank_processes.run(WORLD, _all_reduce_rank, init_method, shared_memory, _sync(),
                                 killed=[VICTIM])
    for rank in range(WORLD - 1):
        kind, message, seconds = results[rank]
        assert kind == "CollectiveError", message
        assert "allreduce" in message, message
        assert "'failure-test'" in message, message
        assert f"rank {rank}/{WORLD}" in message, message
        assert seconds <= COLLECTIVE_TIMEOUT_S + SLACK_S, f"raised after {seconds:.1f} s"
        if shared_memory:
            # Seen as dead (a zombie until the launcher reaps it), not waited out.
            assert f"rank {VICTIM}" in message and "exited" in message, message


class _Signalling(torch.autograd.Function):
    """Identity whose backward releases `inside`: the caller is inside backward, past the
    output layer."""

    @staticmethod
    def forward(ctx, x, inside):
        ctx.inside = inside
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.inside.release()
        return grad, None


def _ddp_rank(rank, world, init_method, sync):
    _init_together(rank, world, init_method, sync, name="ddp-failure")
    torch.manual_seed(0)
    model = gradhub.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256), torch.nn.Tanh(),
        torch.nn.Linear(256, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randn(16, 8)
    for _ in range(3):  # healthy steps first
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    optimizer.zero_grad()
    if rank == VICTIM:
        model(x)
        _die_once_survivors_are_in(sync)
    # The loss's gradient passes _Signalling first, so the release comes from inside backward.
    loss = F.mse_loss(_Signalling.apply(model(x), sync[1]), y)
    return _raised_within(loss.backward)


def test_survivors_of_a_killed_peer_raise_from_backward(tmp_path):
    init_method = f"file://{tmp_path}/rendezvous"
    results = rank_processes.run(WORLD, _ddp_rank, init_method, _sync(), killed=[VICTIM])
    for rank in range(WORLD - 1):
        kind, message, seconds = results[rank]
        assert kind in ("RuntimeError", "CollectiveError"), message
        assert "allreduce" in message, message
        assert "'ddp-failure'" in message, message
        assert f"rank {rank}/{WORLD}" in message, message
        assert seconds <= COLLECTIVE_TIMEOUT_S + SLACK_S, f"raised after {seconds:.1f} s"


RENDEZVOUS_TIMEOUT_S = 6.0


def _lonely_rank(rank, world, init_method):
    """Ranks 0 and 1 of a group of 3 whose rank 2 never comes."""
    start = time.monotonic()
    try:
        dist.init("gloo", init_method=init_method, rank=rank, world_size=world + 1,
                  timeout=RENDEZVOUS_TIMEOUT_S)
    except Exception as error:  # noqa: B902 - compared by the test
        return type(error).__name__, str(error), time.monotonic() - start
    raise AssertionError("init() returned without rank 2")


@pytest.mark.parametrize("store", ["tcp", "file"])
def test_a_rank_that_never_comes_is_a_rendezvous_error(tmp_path, store):
    init_method = (f"tcp://127.0.0.1:{rank_processes.free_port()}" if store == "tcp"
                   else f"file://{tmp_path}/rendezvous")
    results = rank_processes.run(WORLD - 1, _lonely_rank, init_method)
    for kind, message, seconds in results:
        assert kind == "RendezvousError", message
        assert "rank" in message and "'default'" in message, message
        assert seconds <= RENDEZVOUS_TIMEOUT_S + SLACK_S, f"raised after {seconds:.1f} s"


def test_rendezvous_error_and_collective_error_are_runtime_errors():
    # Scripts that catch RuntimeError (as for torch.distributed's errors) catch these.
    assert issubclass(dist.CollectiveError, RuntimeError)
    assert issubclass(dist.RendezvousError, RuntimeError)
