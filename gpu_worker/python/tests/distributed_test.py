"""gradhub.distributed: init()'s rendezvous rules and argument checks (in this process, no
peers), and the collectives between real rank processes through gradhub's C++ engine (Gloo,
with the shared-memory allreduce): world 2 finding each other through MASTER_ADDR and
MASTER_PORT as torchrun sets them, world 3 through init_method="tcp://", a second group
through "file://", two ranks started by torchrun itself, and the TCPStore client under every
TCP rendezvous, its gets racing other ranks' sets."""

import datetime
import json
import os
import subprocess
import sys

import pytest
import torch

import gradhub.distributed as dist
import rank_processes

# The variables init() reads; each in-process case starts from none of them.
RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "GRADHUB_RANK", "GRADHUB_WORLD_SIZE",
                        "GRADHUB_STORE", "GRADHUB_JOB_TOKEN", "GRADHUB_JOB_ID",
                        "GRADHUB_ATTEMPT", "GRADHUB_TLS_CA", "MASTER_ADDR", "MASTER_PORT",
                        "TORCHELASTIC_USE_AGENT_STORE", "GRADHUB_COLLECTIVE_TIMEOUT")
DTYPES = (torch.float32, torch.float64, torch.int64)
OPS = ("SUM", "AVG", "MAX", "MIN")
COLLECTIVE_TIMEOUT_S = 60.0


# ----------------------------------------------------------------------------------------
# rendezvous_plan(): a pure function of init_method and the environment.

PLATFORM_ENV = {"GRADHUB_STORE": "grpc://api.internal:7443", "GRADHUB_JOB_TOKEN": "ghj_secret",
                "GRADHUB_JOB_ID": "jobs/job-7", "GRADHUB_ATTEMPT": "2"}
TORCHRUN_ENV = {"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("init_method, expected", [
    ("tcp://10.1.2.3:29500", ("tcp", "10.1.2.3", 29500)),
    ("tcp://node-a.cluster:1", ("tcp", "node-a.cluster", 1)),
    ("tcp://[::1]:65535", ("tcp", "::1", 65535)),
    ("file:///tmp/gradhub/rendezvous", ("file", "/tmp/gradhub/rendezvous")),
])
def test_plan_follows_init_method_first(init_method, expected):
    # Rule 1 wins over both environments.
    assert dist.rendezvous_plan(init_method, {**PLATFORM_ENV, **TORCHRUN_ENV}) == expected


@pytest.mark.parametrize("init_method", [
    "tcp://host", "tcp://:29500", "tcp://host:", "tcp://host:0", "tcp://host:65536",
    "tcp://host:port", "tcp://host:-1", "file://relative/path", "udp://host:1", "host:29500",
])
def test_plan_refuses_a_malformed_init_method(init_method):
    with pytest.raises(ValueError, match="init_method") as raised:
        dist.rendezvous_plan(init_method, TORCHRUN_ENV)
    assert init_method in str(raised.value)


@pytest.mark.parametrize("init_method", [None, "", "env://"])
def test_plan_uses_the_platform_store_before_torchrun(init_method):
    plan = dist.rendezvous_plan(init_method, {**PLATFORM_ENV, **TORCHRUN_ENV})
    assert plan == ("platform", "api.internal:7443", "ghj_secret", "jobs/job-7/attempts/2/python",
                    "")


def test_plan_for_the_platform_takes_a_bare_job_id_and_the_tls_ca():
    env = dict(PLATFORM_ENV, GRADHUB_JOB_ID="job-7", GRADHUB_TLS_CA="/etc/gradhub/ca.pem",
               GRADHUB_STORE="api.internal:7443")
    assert dist.rendezvous_plan(None, env) == (
        "platform", "api.internal:7443", "ghj_secret", "jobs/job-7/attempts/2/python",
        "/etc/gradhub/ca.pem")


@pytest.mark.parametrize("missing", ["GRADHUB_STORE", "GRADHUB_JOB_TOKEN"])
def test_plan_falls_back_to_torchrun_without_store_or_token(missing):
    env = {k: v for k, v in {**PLATFORM_ENV, **TORCHRUN_ENV}.items() if k != missing}
    assert dist.rendezvous_plan(None, env) == ("tcp", "10.0.0.5", 29500)


@pytest.mark.parametrize("change", [{"GRADHUB_JOB_ID": ""}, {"GRADHUB_ATTEMPT": ""},
                                    {"GRADHUB_ATTEMPT": "two"}])
def test_plan_refuses_a_platform_store_without_job_or_attempt(change):
    with pytest.raises(ValueError, match="GRADHUB_JOB_ID or GRADHUB_ATTEMPT"):
        dist.rendezvous_plan(None, {**PLATFORM_ENV, **change})


@pytest.mark.parametrize("port", ["abc", "0", "65536", "-5", "29500 "])
def test_plan_refuses_a_malformed_master_port(port):
    with pytest.raises(ValueError, match="MASTER_PORT") as raised:
        dist.rendezvous_plan(None, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
    assert repr(port).strip("'") in str(raised.value)


@pytest.mark.parametrize("env", [{}, {"MASTER_ADDR": "127.0.0.1"}, {"MASTER_PORT": "29500"},
                                 {"GRADHUB_STORE": "api:1"}, {"GRADHUB_JOB_TOKEN": "ghj_x"}])
def test_plan_without_any_rendezvous_names_what_to_set(env):
    with pytest.raises(ValueError) as raised:
        dist.rendezvous_plan(None, env)
    for name in ("init_method", "GRADHUB_STORE", "GRADHUB_JOB_TOKEN", "MASTER_ADDR",
                 "MASTER_PORT"):
        assert name in str(raised.value)


# ----------------------------------------------------------------------------------------
# init()'s checks, in this process: each fails before any group exists.

@pytest.fixture
def clean_env(monkeypatch):
    for name in RENDEZVOUS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    assert not dist.is_initialized(), "a refused init() left a default group behind"
    dist.destroy()


def test_init_without_any_rendezvous_names_the_variables(clean_env):
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError) as raised:
        dist.init("gloo")
    for name in ("init_method", "GRADHUB_STORE", "MASTER_ADDR", "MASTER_PORT"):
        assert name in str(raised.value)


def test_init_without_rank_names_rank_and_world_size(clean_env):
    with pytest.raises(ValueError, match="RANK and WORLD_SIZE"):
        dist.init("gloo", init_method="tcp://127.0.0.1:1")


def test_init_takes_gradhubs_rank_variables_after_torchruns(clean_env, tmp_path):
    # Refused later (rank 3 of 2), but only once both were read from GRADHUB_*.
    clean_env.setenv("GRADHUB_RANK", "3")
    clean_env.setenv("GRADHUB_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"rank: 3 is not in \[0, world_size 2\)"):
        dist.init("gloo", init_method=f"file://{tmp_path}/store")


@pytest.mark.parametrize("variable", ["RANK", "WORLD_SIZE"])
def test_init_names_a_non_integer_rank_variable(clean_env, variable):
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv(variable, "one")
    with pytest.raises(ValueError, match=f"{variable}: 'one' is not an integer"):
        dist.init("gloo", init_method="tcp://127.0.0.1:1")


@pytest.mark.parametrize("rank, world_size", [(2, 2), (-1, 2), (0, 0)])
def test_init_refuses_a_rank_outside_the_world(clean_env, rank, world_size):
    with pytest.raises(ValueError, match="rank"):
        dist.init("gloo", init_method="tcp://127.0.0.1:1", rank=rank, world_size=world_size)


@pytest.mark.parametrize("value, seconds", [
    (None, 60.0), ("", 60.0), ("45s", 45.0), ("1m30s", 90.0), ("500ms", 0.5), ("1.5h", 5400.0),
    ("2m0.5s", 120.5),
])
def test_the_default_timeout_is_the_jobs(value, seconds):
    env = {} if value is None else {"GRADHUB_COLLECTIVE_TIMEOUT": value}
    assert dist.default_timeout(env) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["45", "s", "0s", "-5s", "5 s", "5sec", "1m30", "abc"])
def test_a_bad_collective_timeout_variable_is_named(value):
    with pytest.raises(ValueError, match="^GRADHUB_COLLECTIVE_TIMEOUT:"):
        dist.default_timeout({"GRADHUB_COLLECTIVE_TIMEOUT": value})


@pytest.mark.parametrize("arguments, name", [
    ({"backend": "mpi"}, "backend"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": -5.0}, "timeout"),
    ({"timeout": "60"}, "timeout"),
    ({"timeout": True}, "timeout"),
    ({"timeout": datetime.timedelta(0)}, "timeout"),
])
def test_init_names_a_bad_argument(clean_env, arguments, name):
    arguments = {"backend": "gloo", **arguments}
    with pytest.raises(ValueError, match=f"^{name}:"):
        dist.init(init_method="tcp://127.0.0.1:1", rank=0, world_size=2, **arguments)


def test_init_refuses_the_nccl_device_option_for_gloo(clean_env, tmp_path):
    with pytest.raises(ValueError, match="^device:"):
        dist.init("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                  device=0)


@pytest.mark.skipif(dist._C.HAS_NCCL, reason="this build has NCCL")
def test_init_refuses_nccl_in_a_build_without_it(clean_env):
    with pytest.raises(ValueError, match="^backend: nccl"):
        dist.init("nccl", init_method="tcp://127.0.0.1:1", rank=0, world_size=2)


def test_collectives_before_init_say_so(clean_env):
    with pytest.raises(RuntimeError, match=r"init\(\) first"):
        dist.all_reduce(torch.zeros(2))
    with pytest.raises(RuntimeError, match=r"init\(\) first"):
        dist.group()


# ----------------------------------------------------------------------------------------
# Collectives between rank processes. Each world runs once (one process per rank, every
# case in turn); the tests below read what its ranks returned.

def _values(rank, dtype):
    """What rank `rank` reduces: small integers, so every sum and average is exact."""
    return torch.tensor([rank + 1, -3 * rank, 7 - 2 * rank, 100 * rank - 50], dtype=dtype)


def _expected_reduction(op, world, dtype):
    stacked = torch.stack([_values(r, dtype) for r in range(world)])
    if op == "SUM":
        return stacked.sum(0)
    if op == "AVG":
        if dtype.is_floating_point:
            return stacked.sum(0) / world
        return torch.div(stacked.sum(0), world, rounding_mode="trunc")
    return stacked.max(0).values if op == "MAX" else stacked.min(0).values


def _init_from(rank, world, rendezvous):
    """Step 1 of every rank: the default group through `rendezvous`, an init_method, or
    ("env", port): torchrun's variables in the environment and no argument at all."""
    if not isinstance(rendezvous, tuple):
        return dist.init("gloo", init_method=rendezvous, rank=rank, world_size=world,
                         timeout=COLLECTIVE_TIMEOUT_S)
    for name in RENDEZVOUS_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(rendezvous[1]), RANK=str(rank),
                      WORLD_SIZE=str(world))
    return dist.init("gloo", timeout=COLLECTIVE_TIMEOUT_S)


def _all_reduces(rank, world):
    results = {}
    for dtype in DTYPES:
        for op in OPS:
            tensor = _values(rank, dtype)
            work = dist.all_reduce(tensor, getattr(dist.ReduceOp, op))
            work.wait()
            results[f"{dtype}/{op}"] = tensor
    # In place into a contiguous slice: only the slice changes.
    base = torch.full((10,), -1.0)
    dist.all_reduce(base[2:6].fill_(rank + 1.0)).wait()
    results["slice"] = base
    # Large and of an odd length: the shared-memory allreduce's chunks and their last one.
    large = torch.full((1_000_003,), rank + 1.0)
    dist.all_reduce(large, dist.ReduceOp.SUM).wait()
    results["large"] = (large.min().item(), large.max().item())
    return results


def _broadcasts(rank, world):
    results = {}
    for src in (0, 1):
        tensor = torch.full((5,), float(rank * 10))
        dist.broadcast(tensor, src=src).wait()
        results[f"tensor from {src}"] = tensor
        tensors = [torch.full((3,), float(rank)), torch.arange(4, dtype=torch.int64) * rank,
                   torch.full((2, 2), rank + 0.5, dtype=torch.float64)]
        dist.broadcast(tensors, src=src).wait()
        results[f"list from {src}"] = tensors
    return results


def _all_gathers(rank, world):
    outputs = [torch.full((3,), -1.0) for _ in range(world)]
    dist.all_gather(outputs, torch.full((3,), rank * 2.0)).wait()
    # Slices of one flat buffer, which the engine writes in place without a temporary.
    flat = torch.zeros(world * 2, dtype=torch.int64)
    dist.all_gather(list(flat.chunk(world)), torch.tensor([rank, -rank])).wait()
    return {"list": outputs, "flat": flat}


def _work_handles(rank, world, released):
    """Rank 0 starts an allreduce the others join only once `released` is set: its Work's
    wait(timeout) must run out, then complete after they join."""
    tensor = torch.full((16,), rank + 1.0)
    early = None
    if rank == 0:
        work = dist.all_reduce(tensor)
        early = rank_processes.raised(lambda: work.wait(timeout=0.5))
        completed_before = work.is_completed()
        released.set()
        work.wait(timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    else:
        released.wait(COLLECTIVE_TIMEOUT_S)
        work = dist.all_reduce(tensor)
        completed_before = False
        work.wait(COLLECTIVE_TIMEOUT_S)
    barrier = dist.barrier()
    barrier.wait()
    return {"early": early, "completed_before": completed_before,
            "completed_after": work.is_completed(), "barrier": barrier.is_completed(),
            "result": tensor}


def _refused_calls(rank, world):
    """Each is refused on this rank alone, before it takes a sequence number."""
    tensor = torch.zeros(3)
    return {
        "non-contiguous": rank_processes.raised(lambda: dist.all_reduce(torch.ones(4, 6).t())),
        "all_gather count": rank_processes.raised(lambda: dist.all_gather([torch.zeros(3)], tensor)),
        "all_gather shape": rank_processes.raised(lambda: dist.all_gather(
            [torch.zeros(3)] + [torch.zeros(4)] * (world - 1), tensor)),
        "src too large": rank_processes.raised(lambda: dist.broadcast(tensor, src=world)),
        "src negative": rank_processes.raised(lambda: dist.broadcast(tensor, src=-1)),
        "dtype": rank_processes.raised(lambda: dist.all_reduce(torch.zeros(3, dtype=torch.int32))),
        "not a tensor": rank_processes.raised(lambda: dist.all_reduce([1.0, 2.0])),
        "op": rank_processes.raised(lambda: dist.all_reduce(tensor, "sum")),
        "init twice": rank_processes.raised(lambda: dist.init("gloo", init_method="tcp://127.0.0.1:1",
                                                rank=rank, world_size=world)),
    }


def _second_group(rank, world, first, rendezvous):
    """destroy() drops the default group (the first stays usable by reference); init()
    makes a new one."""
    dist.destroy()
    before = {"initialized": dist.is_initialized(),
              "all_reduce": rank_processes.raised(lambda: dist.all_reduce(torch.zeros(1)))}
    second = dist.init("gloo", init_method=rendezvous, rank=rank, world_size=world,
                       name="second", timeout=COLLECTIVE_TIMEOUT_S)
    on_second, on_first = torch.tensor([rank + 1.0]), torch.tensor([10.0 * (rank + 1)])
    dist.all_reduce(on_second).wait()
    dist.all_reduce(on_first, group=first).wait()
    dist.barrier().wait()
    return {**before, "name": second.name, "default": dist.group() is second,
            "on_second": on_second, "on_first": on_first}


def _collectives_rank(rank, world, rendezvous, second_rendezvous, released):
    group = _init_from(rank, world, rendezvous)
    results = {
        "identity": [group.rank, group.size, group.name, group.backend.name, dist.get_rank(),
                     dist.get_world_size(), dist.is_initialized(), dist.group() is group],
        "refused": _refused_calls(rank, world),
    }
    # The refused calls took no sequence number: the group is still in step.
    results["all_reduce"] = _all_reduces(rank, world)
    results["broadcast"] = _broadcasts(rank, world)
    results["all_gather"] = _all_gathers(rank, world)
    results["work"] = _work_handles(rank, world, released)
    results["second"] = _second_group(rank, world, group, second_rendezvous)
    return results


@pytest.fixture(scope="module", params=[2, 3], ids=["world2-env", "world3-tcp"])
def world(request, tmp_path_factory):
    """(world size, what each rank returned)."""
    size = request.param
    if size == 2:
        # Every rank reads MASTER_PORT from the environment, like torchrun's children.
        rendezvous = ("env", rank_processes.free_port())
    else:
        rendezvous = f"tcp://127.0.0.1:{rank_processes.free_port()}"
    second = f"file://{tmp_path_factory.mktemp('store')}/rendezvous"
    released = rank_processes.context().Event()
    return size, rank_processes.run(size, _collectives_rank, rendezvous, second, released)


def test_group_identity(world):
    size, ranks = world
    for rank, result in enumerate(ranks):
        assert result["identity"] == [rank, size, "default", "GLOO", rank, size, True, True]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_all_reduce_in_place(world, op, dtype):
    size, ranks = world
    expected = _expected_reduction(op, size, dtype)
    for result in ranks:
        got = torch.from_numpy(result["all_reduce"][f"{dtype}/{op}"])
        assert got.dtype == dtype
        assert torch.equal(got, expected), f"{op} {dtype}: {got} != {expected}"


def test_all_reduce_changes_only_its_slice_and_large_tensors(world):
    size, ranks = world
    total = size * (size + 1) / 2
    for result in ranks:
        assert result["all_reduce"]["slice"].tolist() == [-1.0] * 2 + [total] * 4 + [-1.0] * 4
        assert result["all_reduce"]["large"] == (total, total)


@pytest.mark.parametrize("src", [0, 1])
def test_broadcast_of_a_tensor_and_of_a_list(world, src):
    size, ranks = world
    for result in ranks:
        assert result["broadcast"][f"tensor from {src}"].tolist() == [src * 10.0] * 5
        floats, longs, doubles = result["broadcast"][f"list from {src}"]
        assert floats.tolist() == [float(src)] * 3
        assert longs.tolist() == [0, src, 2 * src, 3 * src] and longs.dtype.name == "int64"
        assert doubles.tolist() == [[src + 0.5] * 2] * 2 and doubles.dtype.name == "float64"


def test_all_gather_into_a_list_and_into_one_buffer(world):
    size, ranks = world
    for result in ranks:
        assert [o.tolist() for o in result["all_gather"]["list"]] == \
            [[r * 2.0] * 3 for r in range(size)]
        assert result["all_gather"]["flat"].tolist() == [v for r in range(size) for v in (r, -r)]


def test_work_wait_runs_out_then_completes_and_barrier(world):
    size, ranks = world
    early = ranks[0]["work"]["early"]
    assert early is not None, "wait(timeout=0.5) returned though the other ranks had not joined"
    assert early[0] == "CollectiveError"
    assert "allreduce" in early[1] and f"rank 0/{size}" in early[1], early[1]
    assert ranks[0]["work"]["completed_before"] is False
    for result in ranks:
        assert result["work"]["completed_after"] is True
        assert result["work"]["barrier"] is True
        assert result["work"]["result"].tolist() == [size * (size + 1) / 2] * 16


@pytest.mark.parametrize("case, kind, words", [
    ("non-contiguous", "ValueError", ["tensor", "contiguous"]),
    ("all_gather count", "ValueError", ["output", "one per rank"]),
    ("all_gather shape", "ValueError", ["output", "[1]", "shape"]),
    ("src too large", "ValueError", ["src"]),
    ("src negative", "ValueError", ["src"]),
    ("dtype", "ValueError", ["int32"]),
    ("not a tensor", "TypeError", ["all_reduce"]),
    ("op", "TypeError", ["all_reduce"]),
    ("init twice", "RuntimeError", ["already initialized"]),
])
def test_bad_arguments_are_refused_naming_them(world, case, kind, words):
    size, ranks = world
    for rank, result in enumerate(ranks):
        refused = result["refused"][case]
        assert refused is not None, f"{case}: accepted"
        assert refused[0] == kind, refused
        for word in words:
            assert word in refused[1], refused[1]


def test_destroy_then_a_second_group_through_a_file(world):
    size, ranks = world
    for rank, result in enumerate(ranks):
        second = result["second"]
        assert second["initialized"] is False
        assert second["all_reduce"][0] == "RuntimeError" and "init()" in second["all_reduce"][1]
        assert second["name"] == "second" and second["default"] is True
        assert second["on_second"].tolist() == [size * (size + 1) / 2]
        assert second["on_first"].tolist() == [10.0 * size * (size + 1) / 2]


# ----------------------------------------------------------------------------------------
# encrypt_traffic: every message over TCP sealed (AES-256-GCM), the same results.

def _sealed_rank(rank, world, rendezvous):
    dist.init("gloo", init_method=rendezvous, rank=rank, world_size=world, shared_memory=False,
              encrypt_traffic=True, timeout=COLLECTIVE_TIMEOUT_S)
    reduced = torch.arange(100_003, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(reduced, dist.ReduceOp.AVG).wait()
    sent = torch.arange(7, dtype=torch.int64) * (rank + 1)
    dist.broadcast(sent, src=world - 1).wait()
    gathered = [torch.full((3,), -1.0) for _ in range(world)]
    dist.all_gather(gathered, torch.full((3,), rank * 2.0)).wait()
    return {"reduced": reduced, "sent": sent, "gathered": gathered}


def test_encrypted_traffic_gives_the_plain_results():
    world = 3
    ranks = rank_processes.run(world, _sealed_rank,
                               f"tcp://127.0.0.1:{rank_processes.free_port()}")
    for result in ranks:
        assert torch.equal(torch.as_tensor(result["reduced"]),
                           torch.arange(100_003, dtype=torch.float32) * 2)
        assert result["sent"].tolist() == [world * i for i in range(7)]
        assert [t.tolist() for t in result["gathered"]] == [[r * 2.0] * 3 for r in range(world)]


def test_init_refuses_encrypt_traffic_with_nccl(clean_env, monkeypatch):
    # Whether or not this build has NCCL, the option is refused before any rendezvous.
    monkeypatch.setattr(dist, "_backend", lambda backend: dist.Backend.NCCL)
    with pytest.raises(ValueError, match="^encrypt_traffic:"):
        dist.init("nccl", init_method="tcp://127.0.0.1:1", rank=0, world_size=2,
                  encrypt_traffic=True)


# ----------------------------------------------------------------------------------------
# torchrun itself: its agent hosts the TCPStore on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE)
# and init() reads everything from the environment it gives its children.

def test_two_ranks_under_torchrun(tmp_path):
    worker = os.path.join(os.path.dirname(__file__), "torchrun_rank.py")
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS_VARIABLES}
    env.update(OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    # --redirects and --tee 1 (the ranks' stdout also to files under --log_dir): torch 1.13's
    # default "0" fails under Python 3.11, whose Flag enums no longer list 0 (nor 3), so
    # Std.from_str finds nothing for it.
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
         "--master_addr=127.0.0.1", f"--master_port={rank_processes.free_port()}",
         "--max_restarts=0", "--monitor_interval=1", "--redirects=1", "--tee=1",
         f"--log_dir={tmp_path / 'logs'}", worker, str(tmp_path)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == {"rank": rank, "size": 2, "sum": 3.0, "gathered": [0.0, 1.0],
                        "agent_store": "True"}


# ----------------------------------------------------------------------------------------
# The TCPStore client under every TCP rendezvous (tcp://, MASTER_ADDR/MASTER_PORT): each
# rank sets a key per round and reads every rank's, racing the others' sets.

def _store_round_trips(rank, world, port, rounds):
    store = dist._C.tcp_store("127.0.0.1", port, world, rank == 0, COLLECTIVE_TIMEOUT_S)
    wrong = []
    for i in range(rounds):
        store.set(f"round/{i}/{rank}", f"value {i} of rank {rank}".encode())
        for r in range(world):
            value = store.get(f"round/{i}/{r}", COLLECTIVE_TIMEOUT_S)
            if value != f"value {i} of rank {r}".encode():
                wrong.append((f"round/{i}/{r}", value))
    # The server (rank 0) stays until every client is done.
    store.set(f"done/{rank}", b"")
    if rank == 0:
        for r in range(world):
            store.get(f"done/{r}", COLLECTIVE_TIMEOUT_S)
    return wrong


def test_tcp_store_get_returns_what_was_set():
    # Before a43f8c8 a Get racing the key's Set could return the client's "absent" sentinel.
    results = rank_processes.run(3, _store_round_trips, rank_processes.free_port(), 30)
    for rank, wrong in enumerate(results):
        assert wrong == [], f"rank {rank} read {len(wrong)} wrong values, e.g. {wrong[:3]}"
