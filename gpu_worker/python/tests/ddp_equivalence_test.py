"""gradhub.DistributedDataParallel trains as torch.nn.parallel.DistributedDataParallel does
(issue 32's acceptance): the same script, seed and data, on real rank processes with gradhub's
engine on one side and torch.distributed's Gloo (its own TCP port) on the other.

  - world 2 and 3, 100 steps of SGD with momentum on an MLP wide enough for several buckets,
    each rank its shard of the global batch: the parameters equal torch DDP's within 1e-6 and
    those of one process trained on the whole global batch within 1e-5;
  - no_sync() accumulation, BatchNorm buffers from rank 0, find_unused_parameters, the fp16,
    bf16 and PowerSGD comm hooks, and state_dict() checkpoints moving between the two."""

import copy
import datetime
import io

import pytest
import torch
import torch.nn.functional as F

import gradhub
import gradhub.distributed as dist
import rank_processes
from gradhub import parallel

STEPS = 100
GLOBAL_BATCH = 24  # divisible by 2 and by 3
IN, HIDDEN, OUT = 16, 512, 4
LEARNING_RATE, MOMENTUM = 0.02, 0.9
# Later buckets of 256 KiB (the first is 1 MiB): the MLP's 3.2 MB of gradients make several,
# so gradhub's bucket order and overlap are part of what must agree.
BUCKET_CAP_MB = 0.25
TIMEOUT_S = 120.0


def make_mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, OUT))


def make_batch_norm_net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, 32), torch.nn.BatchNorm1d(32), torch.nn.Tanh(),
        torch.nn.Linear(32, OUT))


class TwoHeads(torch.nn.Module):
    """head_b takes part in the loss only when forward is told to use it."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.trunk = torch.nn.Linear(IN, 32)
        self.head_a = torch.nn.Linear(32, OUT)
        self.head_b = torch.nn.Linear(32, OUT)

    def forward(self, x, use_b):
        hidden = torch.tanh(self.trunk(x))
        out = self.head_a(hidden)
        return out + self.head_b(hidden) if use_b else out


# What the models learn: a fixed random teacher, so the loss can fall.
TEACHER = torch.randn(IN, OUT, generator=torch.Generator().manual_seed(7)) / IN ** 0.5


def global_batch(step):
    x = torch.randn(GLOBAL_BATCH, IN, generator=torch.Generator().manual_seed(1000 + step))
    return x, torch.tanh(x @ TEACHER)


def shard_of(rank, world):
    """Rank `rank`'s rows of each step's global batch."""
    return lambda step: tuple(t.chunk(world)[rank] for t in global_batch(step))


def train(model, steps, batch_of, set_to_none=False, use_b=None):
    """SGD with momentum on the mean squared error; the losses seen."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    losses = []
    for step in range(steps):
        x, y = batch_of(step)
        optimizer.zero_grad(set_to_none=set_to_none)
        output = model(x) if use_b is None else model(x, use_b(step))
        loss = F.mse_loss(output, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def init_both(rank, world, rendezvous):
    """gradhub's default group (through a file: distributed_test.py covers the TCP
    rendezvous) and torch.distributed's, on its own port."""
    dist.init("gloo", init_method=rendezvous[0], rank=rank, world_size=world, timeout=TIMEOUT_S)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{rendezvous[1]}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=TIMEOUT_S))


def torch_ddp(module, **options):
    return torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=BUCKET_CAP_MB,
                                                     **options)


def gradhub_ddp(module, **options):
    return gradhub.DistributedDataParallel(module, bucket_cap_mb=BUCKET_CAP_MB, **options)


def max_difference(a, b):
    """The largest absolute difference between two state dicts (numpy or torch values)."""
    assert list(a) == list(b)
    return max(float((torch.as_tensor(a[k]).double() - torch.as_tensor(b[k]).double())
                     .abs().max()) for k in a)


def assert_close(a, b, tolerance, what):
    difference = max_difference(a, b)
    assert difference <= tolerance, f"{what}: differ by {difference:.3g} > {tolerance:g}"


def assert_same_on_every_rank(states, what):
    for rank, state in enumerate(states[1:], start=1):
        assert max_difference(states[0], state) == 0, f"{what}: rank {rank} differs from rank 0"


# ----------------------------------------------------------------------------------------
# The acceptance: 100 steps, world 2 and 3.

def _checkpoints_between(ours, theirs):
    """A state_dict saved from each DDP loads into a fresh one of the other kind."""
    def through_bytes(state):
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        return torch.load(buffer)

    into_torch = torch_ddp(make_mlp(seed=5))
    into_torch.load_state_dict(through_bytes(ours.state_dict()))
    into_gradhub = gradhub_ddp(make_mlp(seed=6))
    into_gradhub.load_state_dict(through_bytes(theirs.state_dict()))
    return {"gradhub keys": list(ours.state_dict()), "torch keys": list(theirs.state_dict()),
            "into torch": into_torch.module.state_dict(),
            "into gradhub": into_gradhub.module.state_dict()}


def _equivalence_rank(rank, world, rendezvous, set_to_none):
    init_both(rank, world, rendezvous)
    # Each rank starts from its own seed: both DDPs must broadcast rank 0's parameters.
    ours = gradhub_ddp(make_mlp(seed=rank))
    theirs = torch_ddp(make_mlp(seed=rank))
    train(ours, STEPS, shard_of(rank, world), set_to_none)
    train(theirs, STEPS, shard_of(rank, world), set_to_none)
    result = {"gradhub": ours.module.state_dict(), "torch": theirs.module.state_dict(),
              "buckets": ours.bucket_assignment(), "stats": ours.last_reduction()}
    if world == 2:
        result["checkpoints"] = _checkpoints_between(ours, theirs)
    torch.distributed.destroy_process_group()
    return result


def _rendezvous(tmp_path_factory):
    """(gradhub's init_method, torch.distributed's port)."""
    return (f"file://{tmp_path_factory.mktemp('store')}/rendezvous", rank_processes.free_port())


@pytest.fixture(scope="module")
def single_process():
    """The reference: rank 0's initial model trained by one process on every global batch
    (the mean loss over it, which is what averaging each shard's mean gradient gives)."""
    model = make_mlp(seed=0)
    train(model, STEPS, global_batch)
    return {k: v.numpy() for k, v in model.state_dict().items()}


# World 3 also lets the optimizer drop the gradients (zero_grad(set_to_none=True)), which
# gradhub must link to its buckets again at the next forward.
@pytest.fixture(scope="module", params=[(2, False), (3, True)],
                ids=["world2", "world3-set_to_none"])
def trained(request, tmp_path_factory):
    world, set_to_none = request.param
    return world, rank_processes.run(world, _equivalence_rank, _rendezvous(tmp_path_factory),
                                     set_to_none)


def test_parameters_equal_torch_ddp_within_1e6(trained):
    world, ranks = trained
    for rank, result in enumerate(ranks):
        assert_close(result["gradhub"], result["torch"], 1e-6, f"rank {rank}")


def test_parameters_equal_single_process_training_within_1e5(trained, single_process):
    world, ranks = trained
    for rank, result in enumerate(ranks):
        assert_close(result["gradhub"], single_process, 1e-5, f"rank {rank}")
    # Not trivially: training moved the parameters far more than that.
    assert max_difference(single_process, make_mlp(seed=0).state_dict()) > 1e-2


def test_replicas_stay_identical(trained):
    world, ranks = trained
    assert_same_on_every_rank([r["gradhub"] for r in ranks], "gradhub DDP")


def test_gradients_went_in_several_buckets(trained):
    world, ranks = trained
    buckets = ranks[0]["buckets"]
    assert len(buckets) >= 3, buckets
    assert sorted(i for bucket in buckets for i in bucket) == list(range(8))
    assert ranks[0]["stats"]["buckets"] == len(buckets)
    assert ranks[0]["stats"]["bytes"] == 4 * sum(
        p.numel() for p in make_mlp(seed=0).parameters())


def test_state_dict_keys_are_torch_ddps_and_checkpoints_move_both_ways(trained):
    world, ranks = trained
    if world != 2:
        pytest.skip("checked on world 2")
    for result in ranks:
        checkpoints = result["checkpoints"]
        assert checkpoints["gradhub keys"] == checkpoints["torch keys"]
        assert all(k.startswith("module.") for k in checkpoints["gradhub keys"])
        assert max_difference(checkpoints["into torch"], result["gradhub"]) == 0
        assert max_difference(checkpoints["into gradhub"], result["torch"]) == 0


# ----------------------------------------------------------------------------------------
# DDP's features on world 2, each against what it must equal.

def _no_sync(rank, world):
    """Three micro-batches: two under no_sync(), the last one synchronized; against one
    synchronized backward over the three together, and a plain copy that never talks."""
    base = make_mlp(seed=0)
    accumulated, whole = gradhub_ddp(copy.deepcopy(base)), gradhub_ddp(copy.deepcopy(base))
    alone = copy.deepcopy(base)
    x, y = shard_of(rank, world)(0)
    micro = list(zip(x.chunk(3), y.chunk(3)))
    with accumulated.no_sync():
        for mx, my in micro[:2]:
            (F.mse_loss(accumulated(mx), my) / 3).backward()
            (F.mse_loss(alone(mx), my) / 3).backward()
    inside = grads(accumulated.module)
    mx, my = micro[2]
    (F.mse_loss(accumulated(mx), my) / 3).backward()
    F.mse_loss(whole(x), y).backward()
    return {"inside": inside, "alone": grads(alone), "accumulated": grads(accumulated.module),
            "whole": grads(whole.module)}


def _buffers(rank, world):
    """BatchNorm's statistics: rank 0's at construction and before every forward; then 20
    training steps against torch DDP's."""
    model = make_batch_norm_net(seed=rank)
    model[1].running_mean.fill_(rank + 1.0)
    ours = gradhub_ddp(model)
    at_construction = copy.deepcopy(dict(ours.module[1].named_buffers()))
    # Each rank's own statistics drift apart (as its forwards would make them)...
    ours.module[1].running_mean.fill_(10.0 * (rank + 1))
    ours.module[1].running_var.fill_(rank + 2.0)
    ours.module[1].num_batches_tracked.fill_(rank + 7)
    # ...and an evaluation forward (which updates none) sees rank 0's.
    ours.eval()
    with torch.no_grad():
        ours(shard_of(rank, world)(0)[0])
    after_eval_forward = dict(ours.module[1].named_buffers())
    trained_ours = gradhub_ddp(make_batch_norm_net(seed=rank))
    trained_theirs = torch_ddp(make_batch_norm_net(seed=rank))
    train(trained_ours, 20, shard_of(rank, world))
    train(trained_theirs, 20, shard_of(rank, world))
    return {"at construction": at_construction, "after eval forward": after_eval_forward,
            "gradhub": trained_ours.module.state_dict(),
            "torch": trained_theirs.module.state_dict()}


def _uses_head_b(rank):
    # Step 0: rank 0 only; step 1: neither (unused on every rank); step 2: rank 1 only.
    return lambda step: (step + rank) % 3 == 0


def _find_unused(rank, world):
    ours = gradhub_ddp(TwoHeads(seed=rank), find_unused_parameters=True)
    theirs = torch_ddp(TwoHeads(seed=rank), find_unused_parameters=True)
    train(ours, 12, shard_of(rank, world), use_b=_uses_head_b(rank))
    train(theirs, 12, shard_of(rank, world), use_b=_uses_head_b(rank))
    return {"gradhub": ours.module.state_dict(), "torch": theirs.module.state_dict()}


def _unused_without_find_unused(rank, world):
    """Every rank leaves head_b out without having said find_unused_parameters: backward
    raises naming it (on every rank alike, so the group stays in step)."""
    model = gradhub_ddp(TwoHeads(seed=0))
    x, y = shard_of(rank, world)(0)
    try:
        F.mse_loss(model(x, False), y).backward()
    except RuntimeError as error:
        return str(error)
    return None


def _comm_hooks(rank, world):
    hooks = {"plain": None, "fp16": parallel.fp16_compress(), "bf16": parallel.bf16_compress(),
             "powersgd": parallel.powersgd(matrix_approximation_rank=1, start_iter=3)}
    results = {}
    for name, hook in hooks.items():
        model = gradhub_ddp(make_mlp(seed=rank), comm_hook=hook)
        losses = train(model, 30, shard_of(rank, world))
        results[name] = {"state": model.module.state_dict(), "losses": losses}
    return results


def _registered_hooks(rank, world):
    """torch's DDP API for hooks: torch's own fp16_compress_hook, which gradhub runs as its
    C++ fp16 hook, registered on both DDPs."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    ours, theirs = gradhub_ddp(make_mlp(seed=rank)), torch_ddp(make_mlp(seed=rank))
    ours.register_comm_hook(None, default_hooks.fp16_compress_hook)
    theirs.register_comm_hook(None, default_hooks.fp16_compress_hook)
    train(ours, 30, shard_of(rank, world))
    train(theirs, 30, shard_of(rank, world))
    python_hook = gradhub_ddp(make_mlp(seed=rank))
    return {"gradhub": ours.module.state_dict(), "torch": theirs.module.state_dict(),
            "after the first step": rank_processes.raised(
                lambda: ours.register_comm_hook(None, default_hooks.allreduce_hook)),
            "a python hook": rank_processes.raised(
                lambda: python_hook.register_comm_hook(None, lambda state, bucket: None))}


def _features_rank(rank, world, rendezvous):
    init_both(rank, world, rendezvous)
    result = {"no_sync": _no_sync(rank, world), "buffers": _buffers(rank, world),
              "find_unused": _find_unused(rank, world), "hooks": _comm_hooks(rank, world),
              "registered hooks": _registered_hooks(rank, world),
              "unused without find_unused": _unused_without_find_unused(rank, world)}
    torch.distributed.destroy_process_group()
    return result


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    return rank_processes.run(2, _features_rank, _rendezvous(tmp_path_factory))


def test_no_sync_accumulates_locally_then_equals_one_big_batch(features):
    for rank, result in enumerate(features):
        no_sync = result["no_sync"]
        # Inside no_sync nothing was averaged: the gradients are this rank's own.
        assert_close(no_sync["inside"], no_sync["alone"], 1e-7, f"rank {rank} inside no_sync")
        assert_close(no_sync["accumulated"], no_sync["whole"], 1e-6, f"rank {rank}")
    # ...and the ranks' own gradients differed, so the check above could fail.
    assert max_difference(features[0]["no_sync"]["inside"],
                          features[1]["no_sync"]["inside"]) > 1e-3


def test_buffers_are_rank_0s(features):
    for rank, result in enumerate(features):
        buffers = result["buffers"]
        assert buffers["at construction"]["running_mean"].tolist() == [1.0] * 32
        after = buffers["after eval forward"]
        assert after["running_mean"].tolist() == [10.0] * 32, f"rank {rank}"
        assert after["running_var"].tolist() == [2.0] * 32, f"rank {rank}"
        assert int(after["num_batches_tracked"]) == 7, f"rank {rank}"


def test_batch_norm_training_equals_torch_ddp(features):
    for rank, result in enumerate(features):
        buffers = result["buffers"]
        assert_close(buffers["gradhub"], buffers["torch"], 1e-6, f"rank {rank}")


def test_find_unused_parameters_equals_torch_ddp(features):
    for rank, result in enumerate(features):
        unused = result["find_unused"]
        assert_close(unused["gradhub"], unused["torch"], 1e-6, f"rank {rank}")
    assert_same_on_every_rank([r["find_unused"]["gradhub"] for r in features], "find_unused")


def test_an_unused_parameter_without_find_unused_parameters_is_named(features):
    for result in features:
        message = result["unused without find_unused"]
        assert message is not None, "backward without head_b's gradient did not raise"
        assert "head_b.weight" in message and "head_b.bias" in message, message
        assert "find_unused_parameters" in message, message
        assert "head_a" not in message and "trunk" not in message, message


@pytest.mark.parametrize("hook", ["fp16", "bf16"])
def test_compressed_hooks_train_close_to_plain(features, hook):
    for rank, result in enumerate(features):
        plain = result["hooks"]["plain"]["state"]
        compressed = result["hooks"][hook]["state"]
        assert_close(compressed, plain, 2e-2, f"{hook} rank {rank}")
        # The hook was applied, not ignored: rounding the gradients changed the result.
        assert max_difference(compressed, plain) > 0, f"{hook} trained exactly as plain"
    assert_same_on_every_rank([r["hooks"][hook]["state"] for r in features], hook)


def test_torchs_fp16_hook_registered_runs_as_gradhubs(features):
    for rank, result in enumerate(features):
        registered = result["registered hooks"]
        # Translated to the C++ hook comm_hook=fp16_compress() gives: the very same training.
        assert max_difference(registered["gradhub"], result["hooks"]["fp16"]["state"]) == 0
        assert_close(registered["gradhub"], registered["torch"], 1e-3, f"rank {rank}")
        assert registered["after the first step"][0] == "RuntimeError"
        kind, message = registered["a python hook"]
        assert kind == "TypeError" and message.startswith("hook:"), message


def test_powersgd_trains(features):
    for rank, result in enumerate(features):
        losses = result["hooks"]["powersgd"]["losses"]
        assert all(loss == loss and abs(loss) < 1e3 for loss in losses), losses
        assert sum(losses[-5:]) < sum(losses[:5]), losses
        assert max_difference(result["hooks"]["powersgd"]["state"],
                              result["hooks"]["plain"]["state"]) > 0
    assert_same_on_every_rank([r["hooks"]["powersgd"]["state"] for r in features], "powersgd")


# ----------------------------------------------------------------------------------------
# The constructor's checks, in this process: each raises before it needs a group.

@pytest.mark.parametrize("arguments, error, name", [
    ({"bucket_cap_mb": 0}, ValueError, "bucket_cap_mb"),
    ({"gradient_as_bucket_view": False}, ValueError, "gradient_as_bucket_view"),
    ({"comm_hook": "fp16"}, TypeError, "comm_hook"),
    ({"device_ids": [0, 1]}, ValueError, "device_ids"),
    ({"device_ids": [0]}, ValueError, "device_ids"),
    ({"output_device": "cuda:0"}, ValueError, "output_device"),
])
def test_constructor_names_a_bad_argument(arguments, error, name):
    with pytest.raises(error, match=f"^{name}:"):
        gradhub.DistributedDataParallel(torch.nn.Linear(2, 2), **arguments)


def test_constructor_refuses_what_is_not_a_module_and_needs_init():
    with pytest.raises(TypeError, match="^module:"):
        gradhub.DistributedDataParallel(lambda x: x)
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=r"init\(\) first"):
        gradhub.DistributedDataParallel(torch.nn.Linear(2, 2))
