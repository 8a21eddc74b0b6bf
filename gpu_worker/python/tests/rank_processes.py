"""Ranks as real processes for the pytest suites of gradhub.distributed and
gradhub.DistributedDataParallel (*_test.py beside this file).

run(world, target, *args) starts one process per rank with multiprocessing's "spawn" context
(a fresh interpreter: no engine threads or locks inherited through fork), each calling
target(rank, world, *args) with one thread for torch and OpenBLAS, and returns what they
returned, by rank. The protocol:
  1. Every rank puts (rank, ("ok", value)) or (rank, ("error", traceback)) on one queue, once.
     Tensors in `value` travel as numpy arrays (torch's own pickling of tensors shares memory
     with the sender, which may have exited by the time the test reads them).
  2. The test collects until every rank that should report has reported, the deadline
     passes, or every rank that has not reported has exited (a crash: no point waiting).
  3. Each process then gets EXIT_GRACE_S to exit on its own; one that does not is killed and
     reported as hung at exit (a script that cannot end is a bug too). What ranks still
     reported meanwhile is kept, to say what a late rank was doing.
  4. Anything wrong (an error, a missing result, a rank that should have died by SIGKILL but
     did not, or the other way round) fails the test with every rank's story in one message.
`target` must be a module-level function of an importable module (spawn pickles it by name).
"""

import multiprocessing
import os
import queue
import socket
import time
import traceback

# Read by every interpreter at startup, so it must be in the environment before the spawn.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# torch's own Gloo (the torch DDP reference) picks its interface from the hostname otherwise.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

_CONTEXT = multiprocessing.get_context("spawn")

# Generous: the suites run on a loaded 2-core machine where starting an interpreter and
# importing torch alone takes seconds per rank.
DEFAULT_TIMEOUT_S = 240.0
EXIT_GRACE_S = 30.0
SIGKILL_EXIT = -9


def context():
    """The multiprocessing context the ranks run in: make Events and Semaphores shared with
    them from it."""
    return _CONTEXT


_ports_given = set()


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice), never the
    same twice in this process: a closed socket's port may come back at the next bind."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            return port


def raised(call):
    """(type name, message) of what call() raised, None if it returned: how a rank reports an
    expected error to the test."""
    try:
        call()
    except Exception as error:  # noqa: B902 - compared by the test
        return type(error).__name__, str(error)
    return None


def plain(value):
    """`value` with every torch tensor replaced by a numpy copy, through dicts, lists and
    tuples."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone().numpy()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value)
    return value


def _rank_main(target, rank, world, args, results):
    import torch
    torch.set_num_threads(1)
    try:
        outcome = ("ok", plain(target(rank, world, *args)))
    except BaseException:  # noqa: B902 - reported to the test, whatever it was
        outcome = ("error", traceback.format_exc())
    results.put((rank, outcome))
    results.close()
    results.join_thread()


def _collect(processes, results, expected, deadline):
    """Step 2 of the protocol: {rank: outcome} of the ranks that reported."""
    outcomes = {}
    while len(outcomes) < len(expected):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            rank, outcome = results.get(timeout=min(remaining, 1.0))
            outcomes[rank] = outcome
        except queue.Empty:
            silent = [r for r in expected if r not in outcomes]
            if all(processes[r].exitcode is not None for r in silent):
                # Their results may still be in the pipe: one more short look.
                try:
                    rank, outcome = results.get(timeout=1.0)
                    outcomes[rank] = outcome
                    continue
                except queue.Empty:
                    break
    return outcomes


def _drain(results, outcomes):
    """Outcomes that arrived after _collect stopped looking (marked late)."""
    while True:
        try:
            rank, (kind, value) = results.get(timeout=0.5)
        except queue.Empty:
            return
        outcomes.setdefault(rank, (kind, value, "late"))


def _reap(processes):
    """Step 3: the ranks that had to be killed because they did not exit."""
    hung = []
    deadline = time.monotonic() + EXIT_GRACE_S
    for rank, process in enumerate(processes):
        process.join(max(0.1, deadline - time.monotonic()))
        if process.exitcode is None:
            process.kill()
            process.join()
            hung.append(rank)
    return hung


def _problems(processes, outcomes, killed, hung):
    """Step 4: one line (or traceback) per thing that went wrong."""
    problems = []
    for rank, process in enumerate(processes):
        if rank in killed:
            if rank in hung or process.exitcode != SIGKILL_EXIT:
                problems.append(f"rank {rank}: should have killed itself with SIGKILL, but "
                                f"{'hung' if rank in hung else f'exited {process.exitcode}'}"
                                f" (outcome {outcomes.get(rank)})")
            continue
        outcome = outcomes.get(rank)
        if outcome is None:
            problems.append(f"rank {rank}: no result, " + (
                "still running at the deadline (killed)" if rank in hung
                else f"exited {process.exitcode}"))
            continue
        if len(outcome) > 2:
            problems.append(f"rank {rank}: still running at the deadline, then " + (
                f"raised:\n{outcome[1]}" if outcome[0] == "error" else "returned"))
        elif outcome[0] == "error":
            problems.append(f"rank {rank} raised:\n{outcome[1]}")
        if rank in hung:
            problems.append(f"rank {rank}: did not exit within {EXIT_GRACE_S} s after its "
                            "result (killed)")
    return problems


def run(world, target, *args, timeout=DEFAULT_TIMEOUT_S, killed=()):
    """Runs target(rank, world, *args) in `world` spawned processes and returns their return
    values by rank (None for the ranks in `killed`, which must die by SIGKILL). Raises
    AssertionError naming every rank that failed, with its traceback."""
    results = _CONTEXT.Queue()
    processes = [_CONTEXT.Process(target=_rank_main, args=(target, rank, world, args, results),
                                  name=f"rank-{rank}", daemon=True) for rank in range(world)]
    for process in processes:
        process.start()
    expected = [rank for rank in range(world) if rank not in killed]
    outcomes = {}
    try:
        outcomes = _collect(processes, results, expected, time.monotonic() + timeout)
    finally:
        hung = _reap(processes)
        _drain(results, outcomes)
    problems = _problems(processes, outcomes, set(killed), hung)
    if problems:
        raise AssertionError(f"{target.__name__} with {world} ranks:\n" + "\n".join(problems))
    return [outcomes[rank][1] if rank in outcomes else None for rank in range(world)]
