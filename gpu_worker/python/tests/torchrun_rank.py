"""One rank started by torchrun for distributed_test.py: gradhub.distributed.init() with no
argument, from the environment torchrun gives its children; writes what it saw as JSON to
<the directory given as its argument>/rank<RANK>.json."""

import json
import os
import sys

import torch

import gradhub.distributed as dist

torch.set_num_threads(1)
group = dist.init("gloo", timeout=120)
total = torch.tensor([group.rank + 1.0])
dist.all_reduce(total).wait()
gathered = [torch.zeros(1) for _ in range(group.size)]
dist.all_gather(gathered, torch.tensor([float(os.environ["LOCAL_RANK"])])).wait()
dist.barrier().wait()
with open(os.path.join(sys.argv[1], f"rank{group.rank}.json"), "w") as out:
    json.dump({"rank": group.rank, "size": group.size, "sum": total.item(),
               "gathered": [g.item() for g in gathered],
               "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE")}, out)
