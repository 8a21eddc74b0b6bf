"""gradhub.distributed: gradhub's process groups and collectives on torch tensors.

    import gradhub.distributed as dist
    group = dist.init()                       # from gradhub's or torchrun's environment
    dist.all_reduce(tensor).wait()            # in place; ReduceOp.SUM by default
    work = group.broadcast(tensor, src=0)     # every collective returns a Work
    work.wait(timeout=5.0)                    # CollectiveError if it fails or runs out

The collectives are the C++ engine's (gpu_worker/ddp/comm): Gloo over TCP or, when every rank
is on one host, an allreduce through shared memory; NCCL on GPUs. A collective that fails (a
peer died, the network broke) or does not finish within the group's timeout raises
CollectiveError naming the operation, the group and the rank; it never hangs.

Rendezvous: how init() finds the other ranks, first match wins
  1. init_method="tcp://host:port": torch's TCPStore at that address, hosted by rank 0
     (or by torchrun's agent when TORCHELASTIC_USE_AGENT_STORE=True, as torchrun sets it);
     "file:///path": a file every rank on one machine can reach; "env://": as with None.
  2. GRADHUB_STORE and GRADHUB_JOB_TOKEN (set by gradhub's agent for every rank of a script
     job): the platform's rendezvous store in gradhub-api, under this attempt's keys
     (jobs/{GRADHUB_JOB_ID}/attempts/{GRADHUB_ATTEMPT}/), with the rank's own credential.
     No port to pick, and a script that also starts torch.distributed on MASTER_PORT does not
     collide with it.
  3. MASTER_ADDR and MASTER_PORT (torchrun's): as tcp://MASTER_ADDR:MASTER_PORT.
rank and world_size default to RANK and WORLD_SIZE (then GRADHUB_RANK, GRADHUB_WORLD_SIZE).
"""

import datetime
import os
import re

from . import _engine

_C = _engine.load()

Backend = _C.Backend
ReduceOp = _C.ReduceOp
ProcessGroup = _C.ProcessGroup
Work = _C.Work
CollectiveError = _C.CollectiveError
RendezvousError = _C.RendezvousError

__all__ = [
    "Backend", "CollectiveError", "ProcessGroup", "ReduceOp", "RendezvousError", "Work",
    "all_gather", "all_reduce", "barrier", "broadcast", "destroy", "get_rank",
    "get_world_size", "group", "init", "is_initialized",
]

# The collective timeout by default: far below NCCL's 10 minutes, so a dead peer surfaces
# quickly and the job restarts (the engine's kDefaultCollectiveTimeout).
DEFAULT_TIMEOUT = 60.0

# What gradhub's agent sets from the job's distributed.collectiveTimeoutSeconds ("45s"), or
# passes on from its own environment (any duration the trainer's flag takes: "1m30s", "500ms").
TIMEOUT_VARIABLE = "GRADHUB_COLLECTIVE_TIMEOUT"
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|ms|s|m|h)")


def default_timeout(env):
    """init()'s timeout when none is given: GRADHUB_COLLECTIVE_TIMEOUT (a positive duration in
    absl's syntax, as the trainer reads it), else DEFAULT_TIMEOUT seconds. ValueError naming
    the variable when it is set but not such a duration."""
    text = env.get(TIMEOUT_VARIABLE, "")
    if not text:
        return DEFAULT_TIMEOUT
    seconds, at = 0.0, 0
    for part in _DURATION_PART.finditer(text):
        if part.start() != at:
            break
        seconds += float(part.group(1)) * _DURATION_UNITS[part.group(2)]
        at = part.end()
    if at != len(text) or not seconds > 0:
        raise ValueError(f"{TIMEOUT_VARIABLE}: {text!r} is not a positive duration "
                         "(e.g. 45s, 1m30s, 500ms)")
    return seconds

_default_group = None


def _seconds(name, value):
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: must be a positive number of seconds or a timedelta, "
                         f"not {value!r}")
    return float(value)


def _env_int(env, *names):
    for name in names:
        value = env.get(name, "")
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name}: '{value}' is not an integer") from None
    return None


def rendezvous_plan(init_method, env):
    """Which store init() would use, as ("tcp", host, port) | ("file", path) |
    ("platform", address, token, prefix, tls_ca): the rules of the module's docstring as a
    pure function of `init_method` and the environment `env`. ValueError naming what is
    missing or malformed."""
    if init_method and init_method != "env://":
        if init_method.startswith("tcp://"):
            host, sep, port = init_method[len("tcp://"):].rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"init_method: '{init_method}' is not tcp://host:port")
            return ("tcp", host.strip("[]"), int(port))
        if init_method.startswith("file://"):
            path = init_method[len("file://"):]
            if not path.startswith("/"):
                raise ValueError(f"init_method: '{init_method}' is not file:///absolute/path")
            return ("file", path)
        raise ValueError(f"init_method: '{init_method}' is none of env://, tcp://host:port, "
                         "file:///path")
    store, token = env.get("GRADHUB_STORE", ""), env.get("GRADHUB_JOB_TOKEN", "")
    if store and token:
        job, attempt = env.get("GRADHUB_JOB_ID", ""), env.get("GRADHUB_ATTEMPT", "")
        if not job or not attempt.isdigit():
            raise ValueError("GRADHUB_STORE is set but GRADHUB_JOB_ID or GRADHUB_ATTEMPT is not "
                             "(gradhub's agent sets them all for every rank)")
        address = store.removeprefix("grpc://")
        prefix = f"jobs/{job.removeprefix('jobs/')}/attempts/{attempt}/python"
        return ("platform", address, token, prefix, env.get("GRADHUB_TLS_CA", ""))
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if addr and port:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"MASTER_PORT: '{port}' is not a port number")
        return ("tcp", addr, int(port))
    raise ValueError("no rendezvous: give init_method, or run under gradhub (GRADHUB_STORE and "
                     "GRADHUB_JOB_TOKEN) or torchrun (MASTER_ADDR and MASTER_PORT)")


def _make_store(plan, rank, timeout, env):
    if plan[0] == "tcp":
        agent_hosts = env.get("TORCHELASTIC_USE_AGENT_STORE", "") == "True"
        # world_size -1: the server does not wait for every client to connect (the group's
        # rendezvous waits for every rank right after, within the same timeout). libtorch
        # 1.13's TCPStore counts its connect timeout in whole seconds.
        return _C.tcp_store(plan[1], plan[2], -1, rank == 0 and not agent_hosts,
                            max(timeout, 1.0))
    if plan[0] == "file":
        return _C.file_store(plan[1])
    return _C.platform_store(plan[1], plan[2], plan[3], plan[4])


def _backend(backend):
    name = backend.name.lower() if isinstance(backend, Backend) else str(backend).lower()
    if name == "auto":
        import torch
        return Backend.NCCL if _C.HAS_NCCL and torch.cuda.is_available() else Backend.GLOO
    if name == "gloo":
        return Backend.GLOO
    if name == "nccl":
        if not _C.HAS_NCCL:
            raise ValueError("backend: nccl, but this build of gradhub has no NCCL (a CUDA "
                             "libtorch and NCCL at build time)")
        return Backend.NCCL
    raise ValueError(f"backend: '{backend}' is none of auto, gloo, nccl")


def init(backend="auto", *, init_method=None, rank=None, world_size=None,
         timeout=None, name="default", shared_memory=True, device=None,
         encrypt_traffic=False):
    """Joins the job's ranks and returns the default ProcessGroup (also gradhub.distributed's
    module-level collectives' group). Blocks until every rank arrived; RendezvousError when
    they did not within `timeout`.

    backend: "auto" (NCCL when this build has it and CUDA is available, else Gloo), "gloo" or
    "nccl". timeout: seconds (or a timedelta) within which each collective completes or
    raises CollectiveError, and the rendezvous too (a rank or the TCPStore's host that has not
    come by then: RendezvousError); by default the job's (default_timeout: what gradhub's agent
    sets from distributed.collectiveTimeoutSeconds), else 60 s. shared_memory: Gloo allreduce through shared memory when every
    rank is on this host. device: NCCL's CUDA device index (default: the current device).
    encrypt_traffic: Gloo seals every message it sends over TCP with AES-256-GCM under a key
    made for this group (every rank must pass the same value; a message that fails
    authentication raises CollectiveError); NCCL cannot.
    """
    global _default_group
    if _default_group is not None:
        raise RuntimeError("gradhub.distributed.init: already initialized; destroy() first")
    env = os.environ
    rank = _env_int(env, "RANK", "GRADHUB_RANK") if rank is None else rank
    world_size = _env_int(env, "WORLD_SIZE", "GRADHUB_WORLD_SIZE") if world_size is None \
        else world_size
    if rank is None or world_size is None:
        raise ValueError("rank and world_size: give them, or set RANK and WORLD_SIZE")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: {rank} is not in [0, world_size {world_size})")
    chosen = _backend(backend)
    timeout = default_timeout(env) if timeout is None else _seconds("timeout", timeout)
    plan = rendezvous_plan(init_method, env)
    options = {}
    if chosen == Backend.GLOO:
        options["shared_memory"] = bool(shared_memory)
        options["encrypt_traffic"] = bool(encrypt_traffic)
        # The node's advertised address, set by gradhub's agent; "" elsewhere (then
        # GLOO_SOCKET_IFNAME's interface, else the hostname).
        options["hostname"] = env.get("GRADHUB_LISTEN_ADDRESS", "")
        if device is not None:
            raise ValueError("device: is NCCL's setting, but the backend is gloo")
    else:
        if shared_memory is not True:
            raise ValueError("shared_memory: is Gloo's setting, but the backend is nccl")
        if encrypt_traffic:
            raise ValueError("encrypt_traffic: is Gloo's setting (NCCL has no encrypted "
                             "transport), but the backend is nccl")
        import torch
        options["device"] = torch.cuda.current_device() if device is None else int(device)
    store = _make_store(plan, rank, timeout, env)
    _default_group = ProcessGroup(store, rank, world_size, chosen, name=name, timeout=timeout,
                                  **options)
    return _default_group


def is_initialized():
    """Whether init() has made the default group (and destroy() has not dropped it)."""
    return _default_group is not None


def group():
    """The default ProcessGroup; RuntimeError before init()."""
    return _default_or_raise()


def destroy():
    """Drops the default group (its connections close once no DDP or Work holds it)."""
    global _default_group
    _default_group = None


def _resolve(given):
    return given if given is not None else _default_or_raise()


def _default_or_raise():
    if _default_group is None:
        raise RuntimeError("gradhub.distributed: call init() first")
    return _default_group


def get_rank(group=None):
    return _resolve(group).rank


def get_world_size(group=None):
    return _resolve(group).size


def all_reduce(tensor, op=ReduceOp.SUM, group=None):
    """Reduces `tensor` across the group's ranks, in place. Returns its Work."""
    return _resolve(group).all_reduce(tensor, op)


def broadcast(tensor, src=0, group=None):
    """Copies rank `src`'s `tensor` (or list of tensors) to every rank, in place."""
    return _resolve(group).broadcast(tensor, src)


def all_gather(output_tensors, input_tensor, group=None):
    """output_tensors[r] receives rank r's `input_tensor` (torch.distributed's order)."""
    return _resolve(group).all_gather(output_tensors, input_tensor)


def barrier(group=None):
    """Returns once every rank of the group has entered it (wait on the Work)."""
    return _resolve(group).barrier()
