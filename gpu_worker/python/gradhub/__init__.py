"""gradhub: what a training script running as a gradhub script job uses of the platform.

Standard library only (Python 3.11), so it imports on any node; it never needs torch. The
agent puts it on every rank's PYTHONPATH. A script that does not run under gradhub (plain
torchrun, a laptop) uses it unchanged: report() prints the same lines, and checkpoints go to a
local folder.

Progress
--------
report(step, loss=None, *, metrics=None, epoch=None, learning_rate=None,
       samples_per_second=None, total_steps=None)
    Prints one progress record to stdout and flushes, exactly as gradhub-trainer prints its
    own (docs/progress-records.md):
        {"event":"progress","step":120,"totalSteps":1000,"epoch":1,"loss":0.25,"lr":0.001}
    With `metrics` ({name: number}) also an evaluation record at the same step:
        {"event":"eval","step":120,"eval.accuracy":0.91}
    step is an int >= 0; the others are numbers (ints for epoch and total_steps), or None to
    leave them out. NaN and infinities print as null. A wrong type raises ValueError naming
    the argument. Every rank may call it: the agent reads each rank's step (a rank is RUNNING
    once it reports one; the hang watchdog watches it), and the api takes rank 0's records as
    the job's progress and metric history.
    Under gradhub with GRADHUB_METRICS_URL set (the agent's --metrics-url), each step also
    goes to gradhub-metrics as the rank's telemetry (gradhub_training_loss{job_id,rank},
    gradhub_learning_rate, gradhub_samples_per_second, gradhub_eval_metric, ...): queued
    and posted in batches by a background thread, so report() never waits on the network
    and never fails because of it; an argument not given carries its last value. Steps the
    full queue (1000) could not keep are dropped and counted; at exit the queue gets 1 s.

Checkpoints
-----------
save_checkpoint(step, data) -> step
    Saves `data` (bytes, a path as str or os.PathLike, or a binary file object read from its
    current position to its end) as the job's checkpoint at `step`. Call it on rank 0 (DDP
    replicas hold the same state). A file is streamed, never read into memory whole. Under
    gradhub it goes to the checkpoint store with the rank's own credential, for this attempt;
    the store keeps the job's newest checkpoints (its spec's checkpoint.keepLast, 3 by
    default). A step is saved once: saving the same bytes again is a success, other bytes at
    a saved step raise CheckpointError.
load_latest_checkpoint(path=None) -> None | (step, bytes) | (step, path)
    The job's newest checkpoint, None when it has none (a first attempt). Without `path` its
    bytes; with `path` they are written to that file (which appears whole or not at all) and
    the path is returned. Its sha256 is checked; a mismatch is asked for once more, then
    raises CheckpointError.
Both retry what may pass (HTTP 429, 5xx, a broken connection) a few times with jittered
backoff; what cannot raises CheckpointError, whose message names the call, the HTTP status
and the server's error (e.g. "HTTP 401 UNAUTHENTICATED: ..." once the attempt has ended).

Outside gradhub (GRADHUB_CHECKPOINT_URL and GRADHUB_JOB_TOKEN unset), checkpoints live in
$GRADHUB_CHECKPOINT_DIR (default ./gradhub-checkpoints), with the same rules; the newest 3 are
kept. A gradhub rank without a store's URL (its agent has no --checkpoint-url) raises
CheckpointError rather than keep them in its scratch directory, which a restart does not keep.

Ranks
-----
rank(), world_size(), local_rank(): RANK, WORLD_SIZE, LOCAL_RANK as torchrun and gradhub set
them (0, 1 and 0 when unset).

Distributed training (needs torch and gradhub's C++ engine, gradhub._C)
---------------------------------------------------------------------
gradhub.distributed             process groups and collectives (init, all_reduce, broadcast,
                                all_gather, barrier), see its docstring
gradhub.DistributedDataParallel torch's DDP API over gradhub's C++ Reducer (gradhub.parallel)
Both load on first use, so `import gradhub` stays standard library only and works where the
engine cannot load (no torch, or a torch other than the one the engine was built against: a
venv's pip wheel, a CUDA build); using them there raises ImportError saying which.

Environment (set by gradhub's agent for every rank of a script job)
-------------------------------------------------------------------
GRADHUB_CHECKPOINT_URL  the checkpoint store's REST base URL, http(s)://host:port
GRADHUB_METRICS_URL     gradhub-metrics' HTTP base URL, where report() posts telemetry
GRADHUB_JOB_TOKEN       the rank's credential: this job, this attempt, while it runs
GRADHUB_JOB_ID          the job's id
GRADHUB_ATTEMPT         the attempt the rank belongs to
GRADHUB_RANK            the rank (as RANK) that telemetry reports for
GRADHUB_TLS_CA          PEM file of the CA that signed an https server's certificate
GRADHUB_STORE           grpc://host:port of the platform's rendezvous store (gradhub-api)
"""

import os
import urllib.parse

from ._http import CheckpointError, Server
from ._local import LocalStore
from ._progress import _integer, report
from ._remote import RemoteStore
from ._sources import Source

__all__ = [
    "CheckpointError",
    "DistributedDataParallel",
    "distributed",
    "load_latest_checkpoint",
    "local_rank",
    "rank",
    "report",
    "save_checkpoint",
    "world_size",
]


def _int_env(name, default):
    value = os.environ.get(name, "")
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}: '{value}' is not an integer") from None


def rank():
    """This process's rank among all (RANK), 0 when unset."""
    return _int_env("RANK", 0)


def world_size():
    """The number of ranks (WORLD_SIZE), 1 when unset."""
    return _int_env("WORLD_SIZE", 1)


def local_rank():
    """This process's rank on its node (LOCAL_RANK), 0 when unset."""
    return _int_env("LOCAL_RANK", 0)


def _store():
    """Where checkpoints go: the checkpoint store under gradhub, else a local folder."""
    url = os.environ.get("GRADHUB_CHECKPOINT_URL", "")
    if not url and os.environ.get("GRADHUB_JOB_TOKEN"):
        # A gradhub rank: a local folder would be its scratch directory, gone at a restart.
        raise CheckpointError("GRADHUB_CHECKPOINT_URL is empty: this node's agent was started "
                              "without --checkpoint-url, so its ranks have no checkpoint store")
    if not url:
        return LocalStore(os.environ.get("GRADHUB_CHECKPOINT_DIR") or "gradhub-checkpoints")
    missing = [name for name in ("GRADHUB_JOB_TOKEN", "GRADHUB_JOB_ID", "GRADHUB_ATTEMPT")
               if not os.environ.get(name)]
    if missing:
        raise CheckpointError(f"GRADHUB_CHECKPOINT_URL is set but {', '.join(missing)} is not "
                              "(gradhub's agent sets them all for every rank)")
    job = urllib.parse.quote(os.environ["GRADHUB_JOB_ID"].removeprefix("jobs/"), safe="")
    attempt = _int_env("GRADHUB_ATTEMPT", 0)
    server = Server(url, os.environ["GRADHUB_JOB_TOKEN"], os.environ.get("GRADHUB_TLS_CA"))
    return RemoteStore(server, job, attempt)


def save_checkpoint(step, data):
    """Saves `data` (bytes, a path or a binary file object) as the checkpoint at `step`;
    returns the step. See the module's docstring."""
    step = _integer("step", step, minimum=0)
    source = Source(data)
    try:
        return _store().save(step, source)
    finally:
        source.close()


def load_latest_checkpoint(path=None):
    """None, (step, bytes), or with `path` (step, path). See the module's docstring."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: must be a str or os.PathLike, not {type(path).__name__}")
    return _store().load(None if path is None else os.fspath(path))


def __getattr__(name):
    """gradhub.distributed, gradhub.parallel and gradhub.DistributedDataParallel, imported on
    first use (they import torch and the engine)."""
    if name in ("distributed", "parallel"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    if name == "DistributedDataParallel":
        from .parallel import DistributedDataParallel
        return DistributedDataParallel
    raise AttributeError(f"module 'gradhub' has no attribute '{name}'")
