"""Data-parallel training of a small MLP, written as PyTorch's tutorials write a torchrun
script (multigpu_torchrun.py): the process group from torchrun's environment, the model in
DistributedDataParallel, a DistributedSampler, and a snapshot that rank 0 saves with
torch.save in the working directory and every rank loads at start when it is there.

Run it with torchrun, unchanged:
    torchrun --nproc_per_node 2 train.py --max-steps 300
or as a gradhub script job (../job.yaml):
    gradhub submit -f deploy/examples/script-job/job.yaml

--ddp chooses whose data parallelism trains the model (the rest of the script is the same):
  torch    (default) torch.distributed's process group and torch's DistributedDataParallel.
  gradhub  gradhub's C++ engine (../job-gradhub-ddp.yaml): the process group is
           gradhub.distributed.init(), which finds the other ranks from the rank's
           environment (under gradhub the platform's rendezvous store, under torchrun
           MASTER_ADDR/MASTER_PORT), and the model is gradhub.DistributedDataParallel, whose
           C++ Reducer averages the gradients while backward runs. It needs the `gradhub`
           package with its engine (gradhub._C: on every node of a gradhub cluster, built
           against Debian's python3-torch) and no torch.distributed at all; a collective whose
           peer died raises within its timeout instead of hanging, so the job restarts.
Both save the bare module's state_dict, so a snapshot of one resumes in the other.

When the `gradhub` module is importable (in every rank of a gradhub job), it also reports its
progress (gradhub.report: the job's step and loss, the hang watchdog) and checkpoints through
the platform's checkpoint store (rank 0 saves; every rank loads the latest at start), so a
restarted attempt, on whatever node, resumes from its last saved step and ends with the same
parameters as an uninterrupted run. At the end rank 0 prints
    final parameters sha256 <hex>
of the parameters' bytes in order, to compare runs bit for bit.

Deterministic: the data, the initialization and the data order come from --seed (default
$GRADHUB_SEED, else 0), one thread a rank, and a resumed run skips the batches its step
already trained on, so the same world size and --ddp give the same bits.
"""

import argparse
import hashlib
import io
import itertools
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:
    import gradhub
except ImportError:
    gradhub = None


def pick_device():
    """cuda when this rank has a GPU, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    # torchrun shows a rank every GPU (cuda:LOCAL_RANK); gradhub shows it only its own
    # (CUDA_VISIBLE_DEVICES), as cuda:0.
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


class TorchDDP:
    """--ddp torch: torch.distributed's process group from torchrun's variables (RANK,
    WORLD_SIZE, MASTER_ADDR, ...) and torch's DistributedDataParallel."""

    def __init__(self, device):
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.description = f"torch's DDP over {dist.get_backend()}"

    def wrap(self, model, device):
        from torch.nn.parallel import DistributedDataParallel
        # find_unused_parameters=True keeps DDP's gradient buckets as they are at the start.
        # Without it DDP lays them out again after its first step, so a restarted process's
        # first step sums each gradient at another offset of a bucket than the uninterrupted
        # run did at that step, and a ring allreduce of 3 or more ranks then rounds it
        # differently: the resumed run would not end with the same bits. (DDP warns once
        # that it found no unused parameters; here that is expected.)
        return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                       find_unused_parameters=True)

    def all_reduce_max(self, tensor):
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)

    def close(self):
        dist.destroy_process_group()


class GradhubDDP:
    """--ddp gradhub: gradhub.distributed's process group (from gradhub's or torchrun's
    environment) and gradhub.DistributedDataParallel, the C++ engine's Reducer."""

    def __init__(self, device):
        import gradhub.distributed
        self.dist = gradhub.distributed
        group = self.dist.init(backend="nccl" if device.type == "cuda" else "gloo")
        self.rank, self.world_size = group.rank, group.size
        store = self.dist.rendezvous_plan(None, os.environ)[0]
        found = {"platform": "the platform's store", "tcp": "MASTER_ADDR:MASTER_PORT"}[store]
        self.description = f"gradhub's DDP over {group.backend.name.lower()} (ranks met " \
                           f"through {found})"

    def wrap(self, model, device):
        # Its buckets are laid out again once, after the first step, in the order rank 0's
        # gradients came; this model's come in the order of the first layout, so a restarted
        # process sums every gradient at the offsets the uninterrupted run did.
        return gradhub.DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None)

    def all_reduce_max(self, tensor):
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MAX).wait()

    def close(self):
        self.dist.destroy()


def synthetic_dataset(samples, features, classes, seed):
    """A noisy linear teacher: learnable, but not in a few steps."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, features, generator=generator)
    teacher = torch.randn(features, classes, generator=generator)
    noise = 2.0 * torch.randn(samples, classes, generator=generator)
    return TensorDataset(inputs, (inputs @ teacher + noise).argmax(dim=1))


def make_model(features, hidden, classes, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(features, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, classes))


class Trainer:
    def __init__(self, ddp, model, train_data, optimizer, device, args):
        self.ddp = ddp
        self.rank = ddp.rank
        self.device = device
        self.model = model.to(device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.args = args
        self.step = 0
        self.load_snapshot()
        self.model = ddp.wrap(self.model, device)

    # --- snapshots: gradhub's checkpoint store when there is one, else the local file ---

    def state_bytes(self):
        buffer = io.BytesIO()
        torch.save({"MODEL_STATE": self.model.module.state_dict(),
                    "OPTIMIZER_STATE": self.optimizer.state_dict(),
                    "STEPS_RUN": self.step}, buffer)
        return buffer.getvalue()

    def restore(self, snapshot):
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.step = snapshot["STEPS_RUN"]

    def load_snapshot(self):
        latest = gradhub.load_latest_checkpoint() if gradhub else None
        if latest is not None:
            step, data = latest
            self.restore(torch.load(io.BytesIO(data), map_location=self.device))
            assert self.step == step, f"checkpoint of step {step} holds step {self.step}"
        elif os.path.exists(self.args.snapshot):
            self.restore(torch.load(self.args.snapshot, map_location=self.device))
        # Every rank must start at the same step, or the collectives would pair up wrong.
        steps = torch.tensor([self.step, -self.step], device=self.device)
        self.ddp.all_reduce_max(steps)
        if steps[0].item() != -steps[1].item():
            raise RuntimeError(f"ranks resume from different steps (this one {self.step})")
        if self.step > 0 and self.rank == 0:
            print(f"resumed from step {self.step}", flush=True)

    def save_snapshot(self):
        data = self.state_bytes()
        if gradhub:
            gradhub.save_checkpoint(self.step, data)
        with open(self.args.snapshot + ".tmp", "wb") as file:
            file.write(data)
        os.replace(self.args.snapshot + ".tmp", self.args.snapshot)

    # --- training ---

    def run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def train(self):
        args, steps_per_epoch = self.args, len(self.train_data)
        epoch = self.step // steps_per_epoch
        while self.step < args.max_steps:
            self.train_data.sampler.set_epoch(epoch)
            # A resumed run starts mid-epoch: the batches before its step were trained on.
            batches = itertools.islice(self.train_data, self.step - epoch * steps_per_epoch, None)
            for source, targets in batches:
                loss = self.run_batch(source.to(self.device), targets.to(self.device))
                self.step += 1
                self.after_step(loss)
                if self.step == args.max_steps:
                    break
            epoch += 1

    def after_step(self, loss):
        args = self.args
        if self.step % args.report_every == 0 or self.step == args.max_steps:
            if gradhub:  # every rank: its step feeds the hang watchdog; rank 0's the job's
                gradhub.report(self.step, loss=loss.item(), total_steps=args.max_steps)
            elif self.rank == 0:
                print(f"step {self.step} loss {loss.item():.6f}", flush=True)
        if self.rank == 0 and (self.step % args.save_every == 0 or self.step == args.max_steps):
            self.save_snapshot()
        if args.sleep_per_step > 0:
            time.sleep(args.sleep_per_step)

    def parameters_sha256(self):
        digest = hashlib.sha256()
        for parameter in self.model.module.parameters():
            digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()


def main(args):
    device = pick_device()
    ddp = GradhubDDP(device) if args.ddp == "gradhub" else TorchDDP(device)
    torch.set_num_threads(1)  # ranks share the node's cores; also keeps the sums in one order
    dataset = synthetic_dataset(args.samples, args.features, args.classes, args.seed)
    model = make_model(args.features, args.hidden, args.classes, args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # The ranks given, not read from torch.distributed, which --ddp gradhub does not start.
    sampler = DistributedSampler(dataset, num_replicas=ddp.world_size, rank=ddp.rank,
                                 seed=args.seed, drop_last=True)
    train_data = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, sampler=sampler)
    trainer = Trainer(ddp, model, train_data, optimizer, device, args)
    if trainer.rank == 0:
        print(f"trains on {device} with {ddp.description}, world size {ddp.world_size}",
              flush=True)
    trainer.train()
    if trainer.rank == 0:
        print(f"final parameters sha256 {trainer.parameters_sha256()}", flush=True)
    ddp.close()


def parse_args():
    parser = argparse.ArgumentParser(description="data-parallel MLP on synthetic data")
    parser.add_argument("--max-steps", type=int, default=300, help="optimizer steps in all")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--save-every", type=int, default=50, help="steps between snapshots")
    parser.add_argument("--report-every", type=int, default=10, help="steps between reports")
    parser.add_argument("--snapshot", default="snapshot.pt", help="rank 0's snapshot file")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("GRADHUB_SEED", "0")))
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--ddp", choices=("torch", "gradhub"), default="torch",
                        help="whose DistributedDataParallel: torch's, or gradhub's C++ engine")
    parser.add_argument("--sleep-per-step", type=float, default=0.0,
                        help="seconds; slows the job down, for tests that stop it midway")
    args = parser.parse_args()
    if args.ddp == "gradhub" and gradhub is None:
        parser.error("--ddp gradhub: the gradhub module does not import here (gradhub's agent "
                     "puts it on every rank's PYTHONPATH; elsewhere add build/python)")
    return args


if __name__ == "__main__":
    main(parse_args())
