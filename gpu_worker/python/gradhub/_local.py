"""Checkpoints in a local folder, for a script run outside gradhub (plain torchrun, a laptop):
the same calls and the same rules as the checkpoint store (a step is saved once, the newest
KEEP_LAST are kept, a load checks the sha256), so a script behaves alike in both places.

A checkpoint is two files, step-<step>.ckpt and its record step-<step>.json (step, sha256,
size); the record is written last, so a checkpoint without one was never finished and is
ignored (and removed by the next save)."""

import glob
import hashlib
import json
import os
import re

from ._http import CheckpointError
from ._sources import AtomicFile, copy_hashing

KEEP_LAST = 3
_RECORD = re.compile(r"step-(\d+)\.json$")


class LocalStore:
    def __init__(self, folder):
        self.folder = folder

    def _path(self, step, suffix):
        return os.path.join(self.folder, f"step-{step:020d}{suffix}")

    def _record(self, step):
        try:
            with open(self._path(step, ".json"), encoding="utf-8") as file:
                return json.load(file)
        except FileNotFoundError:
            return None

    def _steps(self):
        """The steps with a record, newest first."""
        names = glob.glob(os.path.join(glob.escape(self.folder), "step-*.json"))
        return sorted((int(_RECORD.search(name).group(1)) for name in names
                       if _RECORD.search(name)), reverse=True)

    def save(self, step, source):
        what = f"save_checkpoint(step={step})"
        os.makedirs(self.folder, exist_ok=True)
        with AtomicFile(self._path(step, ".ckpt")) as staged, source.open() as file:
            size, sha256 = copy_hashing(file, staged)
            committed = self._record(step)
            if committed is not None:
                if committed.get("sha256") == sha256:
                    return step
                raise CheckpointError(
                    f"{what}: step {step} already has a checkpoint with other bytes in "
                    f"{self.folder} (sha256 {committed.get('sha256', '')[:12]}, these "
                    f"{sha256[:12]}); a step is saved once", 409, "ALREADY_EXISTS")
            staged.commit()
        with AtomicFile(self._path(step, ".json")) as record:
            record.write(json.dumps({"step": step, "sha256": sha256, "sizeBytes": size}).encode())
            record.commit()
        self._retain()
        return step

    def _retain(self):
        for step in self._steps()[KEEP_LAST:]:
            for suffix in (".json", ".ckpt"):  # the record first: no half checkpoint is seen
                try:
                    os.unlink(self._path(step, suffix))
                except FileNotFoundError:
                    pass

    def load(self, path=None):
        what = "load_latest_checkpoint()"
        steps = self._steps()
        if not steps:
            return None
        step = steps[0]
        record = self._record(step)
        with open(self._path(step, ".ckpt"), "rb") as file:
            if path is None:
                data = file.read()
                received = hashlib.sha256(data).hexdigest()
            else:
                with AtomicFile(path) as out:
                    _, received = copy_hashing(file, out)
                    if received == record["sha256"]:
                        out.commit()
                data = path
        if received != record["sha256"]:
            raise CheckpointError(
                f"{what}: {self._path(step, '.ckpt')} has sha256 {received[:12]}, not the "
                f"{record['sha256'][:12]} it was saved with", 0, "DATA_LOSS")
        return step, data
