#!/usr/bin/python3
"""Script jobs' start-up and code upload (issue #31), against dd and `import torch` in the
same run, on a local cluster (`gradhub cluster up` in a state directory of its own).

Usage: tests/bench/script/run.sh [BUILD_DIR]      (or this file, with the same argument)
Environment: GRADHUB_BENCH_ROUNDS (3), GRADHUB_BENCH_MIB (64), GRADHUB_BENCH_DIR (parent of
the work directory, /tmp).

Once, before the rounds:
  1. the cluster: `gradhub cluster up` with GRADHUB_STATE_DIR in the work directory (no other
     GRADHUB_* variable reaches it, so the client config it writes is what the CLI uses);
  2. a code directory of GRADHUB_BENCH_MIB MiB: random bytes in 4 files (incompressible, and
     no two rounds share an archive) and a train.py that imports torch, calls
     gradhub.report(1) and exits, as a real script's first step would come after its imports.
Each round, the measures interleaved so that background load hits them alike:
  dd           `dd if=<a file of the same MiB> of=<new file> bs=4M conv=fsync`: what a durable
               write of these bytes costs on this disk (the store's data directory is on the
               same filesystem);
  upload       `gradhub code push DIR` of a tree no one uploaded before (a file of the round's
               number changes its digest): pack, sha256, GetCode (NOT_FOUND), UploadCode, until
               the store answered, i.e. the archive is checked, durable and recorded;
  import torch `/usr/bin/python3 -c "import torch"`, the floor of any PyTorch script's start;
  first step   a world-1 script job naming that upload by digest: from just before `gradhub
               submit` to the time the agent read the script's first progress record (the
               LogEntry's time, from `gradhub logs --output json`; one clock, this machine's).
               It includes scheduling, the agent's first download of the archive (a new digest:
               its cache misses), the sha256 check, unpacking, the rank's credential, the start
               and the script's own imports. The job must end SUCCEEDED with JobProgress.step 1.
               Its phases, from the job's events: to SCHEDULED, to RUNNING (its agent reported
               the rank started: after the code and the credential), to the first step.
Printed: each round's figures, their medians, and the targets of the issue: upload at least
0.5x dd's MB/s; first step at most 1 s more than `import torch`. MB/s are 10^6 bytes a second.
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

PYTHON = "/usr/bin/python3"
DATA_FILES = 4
TRAIN_PY = """\
import torch  # what any PyTorch script pays before its first step

import gradhub

gradhub.report(1)
"""


class Bench:
    def __init__(self, build_dir, work):
        self.gradhub = os.path.join(build_dir, "bin", "gradhub")
        self.work = work
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GRADHUB_")}
        self.env["GRADHUB_STATE_DIR"] = os.path.join(work, "state")

    def cli(self, *args, check=True, stderr=None):
        result = subprocess.run([self.gradhub, *args], env=self.env, capture_output=True,
                                text=True)
        if check and result.returncode != 0:
            raise RuntimeError(f"gradhub {' '.join(args)}: exit {result.returncode}: "
                               f"{result.stderr.strip()}")
        if stderr is not None:
            stderr.append(result.stderr)
        return result.stdout

    def json(self, *args, stderr=None):
        return json.loads(self.cli("--output", "json", *args, stderr=stderr))


def timed(argv, **kwargs):
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, **kwargs)
    return time.perf_counter() - start


def make_code(code_dir, reference, mib):
    """The code directory (random data files and train.py) and a file of the same size."""
    os.makedirs(code_dir)
    per_file = (mib << 20) // DATA_FILES
    with open(reference, "wb") as whole:
        for i in range(DATA_FILES):
            data = os.urandom(per_file)
            with open(os.path.join(code_dir, f"data-{i}.bin"), "wb") as file:
                file.write(data)
            whole.write(data)
    with open(os.path.join(code_dir, "train.py"), "w") as file:
        file.write(TRAIN_PY)


def measure_dd(reference, target):
    if os.path.exists(target):
        os.unlink(target)
    seconds = timed(["dd", f"if={reference}", f"of={target}", "bs=4M", "conv=fsync"])
    os.unlink(target)
    return seconds, os.path.getsize(reference) / seconds / 1e6


def measure_upload(bench, code_dir, round_number):
    with open(os.path.join(code_dir, "round.txt"), "w") as file:
        file.write(f"round {round_number} of {bench.work}\n")
    start, stderr = time.perf_counter(), []
    archive = bench.json("code", "push", code_dir, stderr=stderr)
    seconds = time.perf_counter() - start
    # The CLI's own note, "(uploaded in 0.4 s, ...)": the transfer alone, without packing and
    # hashing (nan if its wording changes).
    transfer = re.search(r"uploaded in ([0-9.]+) s", stderr[0])
    return (seconds, int(archive["sizeBytes"]) / seconds / 1e6,
            float(transfer.group(1)) if transfer else float("nan"), archive["digest"])


def timestamp(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def wait_for_end(bench, job, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = bench.json("get", job)
        if state.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return state
        time.sleep(0.2)
    raise RuntimeError(f"{job} did not end within {timeout} s")


def phases(bench, job, submitted, first_step):
    """Seconds from submit to SCHEDULED, from SCHEDULED to RUNNING (every rank started, as its
    agent reported it), and from RUNNING to the first step, from the job's events."""
    events = bench.json("describe", job)["events"]
    at = {e.get("toState"): timestamp(e["time"]) for e in reversed(events) if e.get("toState")}
    return (at["SCHEDULED"] - submitted, at["RUNNING"] - at["SCHEDULED"],
            first_step - at["RUNNING"])


def measure_first_step(bench, digest, round_number):
    spec = os.path.join(bench.work, f"job-{round_number}.yaml")
    with open(spec, "w") as file:
        file.write(f"displayName: bench-script-start-{round_number}\n"
                   f"script: {{code: \"{digest}\", entrypoint: train.py}}\n"
                   "distributed: {worldSize: 1}\n")
    submitted = time.time()
    job = bench.cli("submit", "-f", spec).strip()
    end = wait_for_end(bench, job)
    if end.get("state") != "SUCCEEDED" or int(end.get("progress", {}).get("step", 0)) != 1:
        raise RuntimeError(f"{job} ended {end.get('state')} ({end.get('stateReason')}), "
                           f"progress {end.get('progress')}")
    for line in bench.cli("--output", "json", "logs", job).splitlines():
        entry = json.loads(line)
        if entry.get("text", "").startswith('{"event":"progress"'):
            first_step = timestamp(entry["time"])
            return (first_step - submitted, *phases(bench, job, submitted, first_step))
    raise RuntimeError(f"{job}: no progress record in its logs")


def print_table(rows, rounds):
    header = ["measure"] + [f"round {i + 1}" for i in range(rounds)] + ["median", "target"]
    print("  ".join(f"{h:>10}" if i else f"{h:<34}" for i, h in enumerate(header)))
    for name, values, target, fmt in rows:
        cells = [format(v, fmt) for v in values] + [format(statistics.median(values), fmt)]
        print(f"{name:<34}  " + "  ".join(f"{c:>10}" for c in cells) + f"  {target:>10}")


def run_rounds(bench, rounds, mib):
    code_dir = os.path.join(bench.work, "code")
    reference = os.path.join(bench.work, "reference.bin")
    make_code(code_dir, reference, mib)
    keys = ("dd_s", "dd_mbs", "up_s", "up_mbs", "transfer_s", "torch_s", "first_s",
            "to_scheduled", "to_started", "to_step")
    figures = {key: [] for key in keys}
    for number in range(1, rounds + 1):
        dd_s, dd_mbs = measure_dd(reference, os.path.join(bench.work, "dd.out"))
        up_s, up_mbs, transfer_s, digest = measure_upload(bench, code_dir, number)
        torch_s = timed([PYTHON, "-c", "import torch"])
        first = measure_first_step(bench, digest, number)
        first_s = first[0]
        for key, value in zip(keys, (dd_s, dd_mbs, up_s, up_mbs, transfer_s, torch_s, *first)):
            figures[key].append(value)
        print(f"round {number}: dd {dd_mbs:.0f} MB/s, upload {up_mbs:.0f} MB/s, import torch "
              f"{torch_s:.2f} s, submit to first step {first_s:.2f} s", flush=True)
    return figures


def report(figures, rounds, mib):
    ratio = [u / d for u, d in zip(figures["up_mbs"], figures["dd_mbs"])]
    excess = [f - t for f, t in zip(figures["first_s"], figures["torch_s"])]
    print(f"\n{mib} MiB of code, {rounds} rounds; seconds and MB/s (10^6 bytes/s)")
    print_table([
        (f"dd bs=4M conv=fsync, s", figures["dd_s"], "", ".3f"),
        ("dd, MB/s", figures["dd_mbs"], "", ".0f"),
        ("gradhub code push (first), s", figures["up_s"], "", ".3f"),
        ("  of which the transfer, s", figures["transfer_s"], "", ".3f"),
        ("upload, MB/s", figures["up_mbs"], "", ".0f"),
        ("upload / dd", ratio, ">= 0.5", ".2f"),
        ("python3 -c 'import torch', s", figures["torch_s"], "", ".3f"),
        ("submit -> first reported step, s", figures["first_s"], "", ".3f"),
        ("  submit -> SCHEDULED", figures["to_scheduled"], "", ".3f"),
        ("  SCHEDULED -> ranks started", figures["to_started"], "", ".3f"),
        ("  ranks started -> first step", figures["to_step"], "", ".3f"),
        ("excess over import torch, s", excess, "<= 1.0", ".3f"),
    ], rounds)
    upload_ok = statistics.median(ratio) >= 0.5
    start_ok = statistics.median(excess) <= 1.0
    print(f"upload {'MEETS' if upload_ok else 'MISSES'} its target; start-up "
          f"{'MEETS' if start_ok else 'MISSES'} its target")


def main():
    build_dir = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "build")
    rounds = int(os.environ.get("GRADHUB_BENCH_ROUNDS", "3"))
    mib = int(os.environ.get("GRADHUB_BENCH_MIB", "64"))
    work = tempfile.mkdtemp(prefix="gradhub-bench-script-",
                            dir=os.environ.get("GRADHUB_BENCH_DIR", "/tmp"))
    os.chmod(work, 0o711)  # as root, PostgreSQL and the ranks run as other users under it
    bench = Bench(build_dir, work)
    try:
        bench.cli("cluster", "up")
        report(run_rounds(bench, rounds, mib), rounds, mib)
    finally:
        bench.cli("cluster", "down", check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
