"""Types of gradhub._C, the C++ engine as a Python extension (gpu_worker/python/bindings).

Every blocking call releases the GIL. Tensors handed to a collective stay referenced by its
Work until it completes.
"""

import datetime
import enum
from typing import List, Optional, Sequence, Union

import torch

Timeout = Union[float, datetime.timedelta]

# The torch this extension was built against (also in gradhub/_build_info.py, which
# gradhub/_engine.py checks against the running torch before it imports _C).
TORCH_VERSION: str
CXX11_ABI: bool
# Whether this build has the NCCL backend (a CUDA libtorch and NCCL found at build time).
HAS_NCCL: bool

class CollectiveError(RuntimeError):
    """A collective failed or ran out of time. The message names the operation, the group and
    the rank, e.g. "allreduce #17 (float32, 4096 elements) in group 'default' rank 1/2: timed
    out after 5000 ms"."""

class RendezvousError(RuntimeError):
    """The ranks did not find each other: a rank never came within the timeout, or the store
    could not be reached."""

class Backend(enum.Enum):
    GLOO = ...
    NCCL = ...

class ReduceOp(enum.Enum):
    SUM = ...
    AVG = ...
    MAX = ...
    MIN = ...

class Store:
    """A rendezvous key-value store (ddp/store.h). Built by the functions below."""
    def set(self, key: str, value: bytes) -> None: ...
    def get(self, key: str, timeout: Optional[Timeout] = None) -> bytes: ...
    def add(self, key: str, delta: int) -> int: ...

def tcp_store(host: str, port: int, world_size: int, is_server: bool,
              timeout: Timeout = 60.0) -> Store:
    """torch's TCPStore (libtorch's c10d), which torchrun's MASTER_ADDR/MASTER_PORT name: the
    server (rank 0 unless torchrun's agent hosts it) listens on `port`; a client waits up to
    `timeout` for it to come up."""
def file_store(path: str) -> Store:
    """Processes on one machine, through a shared file."""
def platform_store(address: str, token: str, prefix: str, tls_ca_file: str = "") -> Store:
    """The job API's StoreService at host:port, with a job token; every key goes under
    `prefix` (jobs/{job}/attempts/{attempt}/...), the only keys that token may touch."""

class Work:
    def wait(self, timeout: Optional[Timeout] = None) -> None:
        """Blocks until the collective completed; raises CollectiveError if it failed or
        `timeout` (default: the group's) passed first."""
    def is_completed(self) -> bool: ...

class ProcessGroup:
    rank: int
    size: int
    name: str
    backend: Backend
    def __init__(self, store: Store, rank: int, size: int, backend: Backend = Backend.GLOO,
                 name: str = "default", timeout: Timeout = 60.0, shared_memory: bool = True,
                 hostname: str = "", device: int = 0, encrypt_traffic: bool = False) -> None:
        """Joins the group: blocks until all `size` ranks arrived through `store` (raises
        RendezvousError after `timeout`). `shared_memory`, `hostname` and `encrypt_traffic`
        (every message over TCP sealed with AES-256-GCM; the same on every rank) are Gloo
        settings, `device` (a CUDA index) NCCL's: giving one for the other backend raises
        ValueError."""
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM) -> Work: ...
    def broadcast(self, tensors: Union[torch.Tensor, Sequence[torch.Tensor]], src: int = 0) -> Work: ...
    def all_gather(self, output_tensors: List[torch.Tensor], input_tensor: torch.Tensor) -> Work: ...
    def barrier(self) -> Work: ...

class CommHook:
    """How the Reducer communicates a bucket; build one with fp16(), bf16() or powersgd()."""
    name: str

def fp16_compress() -> CommHook: ...
def bf16_compress() -> CommHook: ...
def powersgd(matrix_approximation_rank: int = 1, start_iter: int = 10,
             min_compression_rate: float = 2.0, error_feedback: bool = True,
             warm_start: bool = True, seed: int = 0) -> CommHook: ...

class Reducer:
    """The C++ Reducer (ddp/reducer.h) over a Python module's parameters: buckets, every .grad
    a view into its bucket, each bucket's allreduce started from the autograd hook as soon as
    its gradients are ready. Finalize is queued on the autograd engine by the first gradient of
    a prepared step, so loss.backward() returns with averaged gradients (and raises
    CollectiveError's message as a RuntimeError when a collective failed)."""
    def __init__(self, parameters: List[torch.Tensor], names: List[str], group: ProcessGroup,
                 bucket_cap_bytes: int, first_bucket_bytes: int,
                 find_unused_parameters: bool, comm_hook: Optional[CommHook]) -> None: ...
    def prepare(self, outputs: List[torch.Tensor]) -> None: ...
    def zero_grad(self) -> None: ...
    def set_comm_hook(self, hook: Optional[CommHook]) -> None:
        """Before the first synchronized step only (RuntimeError after)."""
    def bucket_assignment(self) -> List[List[int]]: ...
    def last_stats(self) -> dict:
        """{"buckets", "bytes", "wait_seconds", "allreduce_seconds"} of the last synchronized
        backward."""

def verify_same_parameters(group: ProcessGroup, names: List[str],
                           parameters: List[torch.Tensor]) -> None:
    """ValueError on every rank naming the first parameter whose shape or dtype differs."""
def broadcast_coalesced(group: ProcessGroup, tensors: List[torch.Tensor], src: int = 0) -> None:
    """Copies rank `src`'s tensors to every rank in place: one collective per dtype."""

def crc32c(data: Union[bytes, bytearray, memoryview], crc: int = 0) -> int:
    """The CRC-32C (Castagnoli) of a contiguous buffer, continuing `crc` (ISA-L, no GIL): the
    checkpoint client's end-to-end check where the engine is loaded (gradhub/_checksums.py)."""
