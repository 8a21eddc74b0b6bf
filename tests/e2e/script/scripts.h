// The Python programs the script-job e2e tests run as users' code.
#pragma once

namespace gradhub::testing {

// A DDP script written the way PyTorch's tutorials write them for torchrun
// (multigpu_torchrun.py): init_process_group from the environment, DistributedDataParallel,
// DistributedSampler, a torch.save snapshot in the working directory. Nothing of gradhub.
inline constexpr char kTutorialScript[] = R"PY(
import argparse, os, torch, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

class Trainer:
    def __init__(self, model, data, optimizer, snapshot_path):
        self.rank = int(os.environ["RANK"])
        self.model = model
        self.data = data
        self.optimizer = optimizer
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            snapshot = torch.load(snapshot_path)
            self.model.load_state_dict(snapshot["MODEL_STATE"])
            self.epochs_run = snapshot["EPOCHS_RUN"]
        self.model = DDP(self.model)

    def _run_epoch(self, epoch):
        self.data.sampler.set_epoch(epoch)
        for source, targets in self.data:
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(source), targets)
            loss.backward()
            self.optimizer.step()
        print(f"[rank {self.rank}] epoch {epoch} loss {loss.item():.4f}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0:
                torch.save({"MODEL_STATE": self.model.module.state_dict(),
                            "EPOCHS_RUN": epoch + 1}, self.snapshot_path)

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(256, 20), torch.randint(0, 4, (256,)))
    loader = DataLoader(dataset, batch_size=16, shuffle=False, sampler=DistributedSampler(dataset))
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), "snapshot.pt").train(args.epochs)
    print(f"[rank {dist.get_rank()}] of {dist.get_world_size()} done "
          f"local_rank={os.environ['LOCAL_RANK']} group_rank={os.environ['GROUP_RANK']}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
)PY";

// Deterministic DDP training that checkpoints through the gradhub module: every rank loads
// the latest checkpoint at start, rank 0 saves every 5 steps, each step reported. Prints
// "resumed from step N" and, at the end on rank 0, "final parameters sha256 <hex>".
inline constexpr char kCheckpointingScript[] = R"PY(
import hashlib, io, os, sys, time, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import gradhub

STEPS, SAVE_EVERY = int(sys.argv[1]), 5
dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
start = 0
latest = gradhub.load_latest_checkpoint()
if latest is not None:
    step, data = latest
    state = torch.load(io.BytesIO(data))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
if rank == 0:
    print(f"resumed from step {start}", flush=True)
ddp = DDP(model)
for step in range(start, STEPS):
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(8, 16, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin()
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    optimizer.step()
    gradhub.report(step + 1, loss=loss.item())
    if rank == 0 and (step + 1) % SAVE_EVERY == 0:
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step + 1}, buffer)
        gradhub.save_checkpoint(step + 1, buffer.getvalue())
    time.sleep(0.1)
if rank == 0:
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(parameter.detach().numpy().tobytes())
    print(f"final parameters sha256 {digest.hexdigest()}", flush=True)
dist.destroy_process_group()
)PY";

// Fails the way a user's bug does: a traceback's last lines on stderr, then exit 3.
inline constexpr char kFailingScript[] = R"PY(
import sys
print("loading the data", flush=True)
print("Traceback (most recent call last):", file=sys.stderr)
print('  File "fail.py", line 4, in <module>', file=sys.stderr)
print("ValueError: the dataset has no column 'label'", file=sys.stderr, flush=True)
sys.exit(3)
)PY";

// Reports a step, then hangs.
inline constexpr char kHangingScript[] = R"PY(
import time, gradhub
gradhub.report(1, loss=1.0)
time.sleep(100000)
)PY";

// Keeps a secret in its scratch directory and waits to be read.
inline constexpr char kVictimScript[] = R"PY(
import os, time, gradhub
with open("secret.txt", "w") as f:
    f.write("the victim's secret")
gradhub.report(1)
time.sleep(100000)
)PY";

// Tries what a hostile tenant would: argv[1] is the agent's pid, argv[2] a file in another
// job's scratch directory. Prints one line per attempt, and its whole environment.
inline constexpr char kAttackerScript[] = R"PY(
import os, sys
def attempt(what, action):
    try:
        print(f"{what}: READ {action()!r}"[:300], flush=True)
    except Exception as error:
        print(f"{what}: {type(error).__name__}", flush=True)
attempt("agent environ", lambda: open(f"/proc/{sys.argv[1]}/environ", "rb").read())
attempt("other job file", lambda: open(sys.argv[2]).read())
attempt("other job dir", lambda: os.listdir(os.path.dirname(sys.argv[2])))
cmdlines = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmdlines.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode())
            cmdlines.append(open(f"/proc/{pid}/environ", "rb").read().replace(b"\0", b" ").decode())
        except Exception:
            pass
print("proc: " + " || ".join(cmdlines), flush=True)
print("env: " + " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())), flush=True)
)PY";

}  // namespace gradhub::testing
