"""gradhub.DistributedDataParallel: torch.nn.parallel.DistributedDataParallel's API over
gradhub's C++ Reducer.

    import gradhub.distributed as dist
    from gradhub import DistributedDataParallel as DDP
    dist.init()
    model = DDP(model)                       # parameters and buffers from rank 0
    loss = loss_fn(model(x), y)
    loss.backward()                          # returns with gradients averaged over all ranks
    optimizer.step()

The split: this Python class only wraps the module (forward, no_sync, state_dict); the work of
a step is C++ (gradhub._C.Reducer over gpu_worker/ddp/reducer.h). Each parameter's gradient
accumulator carries a C++ hook; when a bucket's gradients are all in, its allreduce starts on
the engine's threads while backward goes on, and the first hook of a step queues the
Reducer's Finalize on the autograd engine, so backward() returns only once every bucket is
averaged, and raises (RuntimeError with the collective's message: operation, group, rank)
if a peer died or the collective timed out. No Python runs between gradients.

state_dict() and load_state_dict() are torch's DDP's: the keys are "module." + the wrapped
module's, so a checkpoint saved from one loads into the other.
"""

import contextlib

import torch

from . import _engine, distributed

_C = _engine.load()

_MB = 1024 * 1024


def fp16_compress():
    """Comm hook: buckets allreduced as float16 (half the bytes), averaged before the cast."""
    return _C.fp16_compress()


def bf16_compress():
    """Comm hook: buckets allreduced as bfloat16."""
    return _C.bf16_compress()


def powersgd(matrix_approximation_rank=1, start_iter=10, min_compression_rate=2.0,
             error_feedback=True, warm_start=True, seed=0):
    """Comm hook: PowerSGD (Vogels et al.), PyTorch's powerSGD_hook's options and defaults."""
    return _C.powersgd(matrix_approximation_rank, start_iter, min_compression_rate,
                       error_feedback, warm_start, seed)


def _hook_from_torch(state, hook):
    """The C++ hook (or None: plain averaging) for register_comm_hook's (state, hook): one of
    gradhub's, or one of torch's built-in hooks that gradhub runs in C++. A Python function of
    one's own is refused: gradhub's buckets never go through Python."""
    if isinstance(hook, _C.CommHook):
        if state is not None:
            raise ValueError("state: gradhub's hooks keep their own state; give None")
        return hook
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    simple = {default_hooks.allreduce_hook: None,
              default_hooks.fp16_compress_hook: _C.fp16_compress,
              default_hooks.bf16_compress_hook: _C.bf16_compress}
    if hook in simple:
        if state is not None:
            raise ValueError("state: gradhub reduces over the DDP's own process group; give None")
        return simple[hook]() if simple[hook] else None
    if hook is psgd.powerSGD_hook:
        if not isinstance(state, psgd.PowerSGDState):
            raise TypeError("state: powerSGD_hook needs a PowerSGDState")
        if state.process_group is not None or state.orthogonalization_epsilon != 0:
            raise ValueError("state: gradhub's PowerSGD takes no process_group and no "
                             "orthogonalization_epsilon")
        # The initial Q's seed is gradhub's own (random_seed only seeds numpy in torch's).
        return _C.powersgd(state.matrix_approximation_rank, state.start_powerSGD_iter,
                           state.min_compression_rate, state.use_error_feedback,
                           state.warm_start, 0)
    raise TypeError(f"hook: {getattr(hook, '__name__', hook)!r} is neither a gradhub hook nor "
                    "one of torch's allreduce/fp16_compress/bf16_compress/powerSGD hooks; "
                    "gradhub runs comm hooks in C++ and cannot call a Python one")


def _tensors_in(value, found):
    """Every tensor in a forward's output (nested tuples, lists, dicts), for
    find_unused_parameters' walk of the autograd graph."""
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _tensors_in(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors_in(item, found)
    return found


def _check_device_ids(module, device_ids, output_device):
    """device_ids and output_device are accepted as torch's DDP takes them for one device per
    process (what gradhub runs): None, or the one device the module is on."""
    devices = {p.device for p in module.parameters()}
    for name, value in (("device_ids", device_ids), ("output_device", output_device)):
        if value is None:
            continue
        wanted = value if name == "output_device" else (
            value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else None)
        if wanted is None:
            raise ValueError(f"{name}: gradhub runs one device per process; give one device "
                             f"or None, not {value!r}")
        device = torch.device(wanted if not isinstance(wanted, int) else f"cuda:{wanted}")
        if devices != {device}:
            raise ValueError(f"{name}: {value!r}, but the module's parameters are on "
                             f"{sorted(str(d) for d in devices)}")


class DistributedDataParallel(torch.nn.Module):
    """Data-parallel training of `module` over `process_group` (default: gradhub.distributed's,
    which init() made).

    bucket_cap_mb: later buckets hold up to this many MiB of gradients (torch's default 25);
    the first holds 1 MiB so its allreduce starts early. find_unused_parameters: detect
    parameters that take no part in a step's loss (a walk over the autograd graph each step).
    comm_hook: fp16_compress(), bf16_compress() or powersgd() from this module, None for a
    plain average. broadcast_buffers: copy rank 0's buffers (BatchNorm statistics) to every
    rank before each forward. gradient_as_bucket_view: gradients are always views into their
    bucket here (no copy in or out); False is refused rather than ignored.
    """

    def __init__(self, module, process_group=None, *, bucket_cap_mb=25.0,
                 find_unused_parameters=False, comm_hook=None, broadcast_buffers=True,
                 device_ids=None, output_device=None, gradient_as_bucket_view=True):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module: must be a torch.nn.Module, not {type(module).__name__}")
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb: must be positive, not {bucket_cap_mb!r}")
        if comm_hook is not None and not isinstance(comm_hook, _C.CommHook):
            raise TypeError("comm_hook: must come from gradhub.parallel (fp16_compress(), "
                            f"bf16_compress(), powersgd()), not {type(comm_hook).__name__}")
        if not gradient_as_bucket_view:
            raise ValueError("gradient_as_bucket_view: gradhub's gradients are always views "
                             "into their bucket; False is not supported")
        _check_device_ids(module, device_ids, output_device)
        self.module = module
        group = process_group if process_group is not None else distributed.group()
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        names = [n for n, _ in named]
        parameters = [p for _, p in named]
        # Plain attributes, not submodules or parameters: state_dict() stays torch DDP's.
        object.__setattr__(self, "process_group", group)
        object.__setattr__(self, "_buffer_list", [b for b in module.buffers()])
        object.__setattr__(self, "broadcast_buffers", bool(broadcast_buffers))
        object.__setattr__(self, "find_unused_parameters", bool(find_unused_parameters))
        object.__setattr__(self, "require_backward_grad_sync", True)
        with torch.no_grad():
            _C.verify_same_parameters(group, names, parameters)
            _C.broadcast_coalesced(group, parameters, 0)
            _C.broadcast_coalesced(group, self._buffer_list, 0)
        reducer = _C.Reducer(parameters, names, group, int(bucket_cap_mb * _MB), _MB,
                             bool(find_unused_parameters), comm_hook)
        object.__setattr__(self, "reducer", reducer)

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and self._buffer_list and self.process_group.size > 1:
            with torch.no_grad():
                _C.broadcast_coalesced(self.process_group, self._buffer_list, 0)
        output = self.module(*inputs, **kwargs)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            tensors = _tensors_in(output, [])
            if any(t.requires_grad for t in tensors):
                self.reducer.prepare(tensors if self.find_unused_parameters else [])
        return output

    @contextlib.contextmanager
    def no_sync(self):
        """Inside it, backward accumulates gradients locally and sends nothing; the first
        forward-backward outside it averages the accumulated sum."""
        previous = self.require_backward_grad_sync
        object.__setattr__(self, "require_backward_grad_sync", False)
        try:
            yield
        finally:
            object.__setattr__(self, "require_backward_grad_sync", previous)

    def zero_grad(self, set_to_none=False):
        """Zeroes every gradient, bucket by bucket; with set_to_none, drops them (.grad is
        None) and the next synchronized forward links each to a zeroed slice of its bucket
        again, as after an optimizer's zero_grad(set_to_none=True)."""
        if set_to_none:
            for parameter in self.module.parameters():
                parameter.grad = None
        else:
            self.reducer.zero_grad()

    def register_comm_hook(self, state, hook):
        """torch DDP's register_comm_hook, before the first backward, for the hooks gradhub
        runs in C++: gradhub's own (state None), or torch's default_hooks.allreduce_hook,
        fp16_compress_hook, bf16_compress_hook, and powerSGD_hook with a PowerSGDState, each
        translated to gradhub's C++ equivalent. TypeError for any other hook."""
        self.reducer.set_comm_hook(_hook_from_torch(state, hook))

    def last_reduction(self):
        """What the last synchronized backward sent: {"buckets", "bytes", "wait_seconds",
        "allreduce_seconds"}."""
        return self.reducer.last_stats()

    def bucket_assignment(self):
        """Parameter indices (of module.parameters() that require grad) per bucket, in launch
        order."""
        return self.reducer.bucket_assignment()
