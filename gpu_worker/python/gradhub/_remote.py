"""Checkpoints in gradhub's checkpoint store, over its REST API (checkpoint_rest.h):
   save: PUT /v1/jobs/{job}/checkpoints/{step}?attempt=N, the bytes as the body, their CRC-32C
         in X-Checkpoint-Crc32c where gradhub's engine is loaded, else their sha256 in
         X-Checkpoint-Sha256 (_checksums.py);
   load: GET /v1/jobs/{job}/checkpoints:latest, then GET /v1/{name}:download, what arrived
         checked against the checkpoint's CRC-32C the same way, else its sha256."""

import io
import json
import urllib.parse

from . import _checksums, _http
from ._http import CheckpointError, RetryableError
from ._sources import AtomicFile, ExactReader


class RemoteStore:
    def __init__(self, server, job, attempt):
        self.server, self.job, self.attempt = server, job, attempt

    # --- save ---

    def save(self, step, source):
        what = f"save_checkpoint(step={step})"
        return _http.with_retries(what, lambda: self._put(step, source, what))

    def _put(self, step, source, what):
        # 1. The size and digest of the bytes as they are now (a file is read through once).
        check = _checksums.new()
        size, digest = source.measure(check)
        path = self.server.path(f"/v1/jobs/{self.job}/checkpoints/{step}?attempt={self.attempt}")
        headers = self.server.headers({
            "Content-Length": str(size),
            "Content-Type": "application/octet-stream",
            check.header: digest,
            "X-Checkpoint-Metadata": "writer=gradhub-python",
        })
        # 2. The bytes, read again in blocks as they are sent.
        connection = self.server.connect()
        try:
            with source.open() as file:
                connection.request("PUT", path, body=ExactReader(file, size), headers=headers)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        if response.status == 200:
            return step
        # 3. The step exists: ours when its digest is (a retry whose first answer was lost).
        if response.status == 409 and _http.error_of(response, body, what).code == "ALREADY_EXISTS":
            committed = response.getheader(check.header, "")
            if committed == digest:
                return step
            raise CheckpointError(
                f"{what}: step {step} of the job already has a committed checkpoint with other "
                f"bytes ({check.header} {committed[:12] or 'unknown'}, these {digest[:12]}); a "
                "step is saved once, so save these under another step", 409, "ALREADY_EXISTS")
        _http.raise_for(response, body, what)

    # --- load ---

    def load(self, path=None):
        """None, or (step, bytes) / (step, path). A digest mismatch is asked once more, with
        the server checking the blob too (it marks a corrupt one BAD); a second one raises."""
        what = "load_latest_checkpoint()"
        for verify in (False, True):
            loaded = _http.with_retries(what, lambda: self._latest_and_download(path, verify, what))
            if loaded is None:
                return None
            step, data, matched, mismatch = loaded
            if matched:
                return step, data
        raise CheckpointError(f"{what}: {mismatch}, again after asking the server to check it",
                              0, "DATA_LOSS")

    def _latest_and_download(self, path, verify, what):
        """None when the job has no checkpoint, else (step, data or path, matched, why not)."""
        latest = self._get_json(f"/v1/jobs/{self.job}/checkpoints:latest", what, none_on_404=True)
        if latest is None:
            return None
        step, check = int(latest["step"]), _checksums.for_checkpoint(latest)
        recorded = check.recorded(latest)
        name = urllib.parse.quote(latest["name"], safe="/")
        query = "?verifySha256=true" if verify else ""
        connection = self.server.connect()
        try:
            connection.request("GET", self.server.path(f"/v1/{name}:download{query}"),
                               headers=self.server.headers())
            response = connection.getresponse()
            if response.status == 404:  # retention removed it after :latest: ask again
                raise RetryableError(_http.error_of(response, response.read(), what))
            if response.status != 200:
                _http.raise_for(response, response.read(), what)
            announced = response.getheader(check.header, "")
            data, received = _receive(response, path, check,
                                      recorded if announced == recorded else None)
        finally:
            connection.close()
        if received == recorded and announced == recorded:
            return step, data, True, ""
        return step, None, False, (f"checkpoint at step {step}: the bytes received have "
                                   f"{check.header} {received[:12]}, not the {recorded[:12]} "
                                   "recorded")

    def _get_json(self, path, what, none_on_404=False):
        connection = self.server.connect()
        try:
            connection.request("GET", self.server.path(path), headers=self.server.headers())
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        if response.status == 404 and none_on_404:
            return None
        if response.status == 200:
            return json.loads(body)
        _http.raise_for(response, body, what)


def _receive(response, path, check, expected):
    """The body of a download, checked as it arrives: (bytes or path, hex digest of `check`).
    With a path, the file appears whole, and only when its digest is `expected`; else nothing
    is left."""
    if path is None:
        buffer = io.BytesIO()
        _pump(response, check, buffer)
        return buffer.getvalue(), check.hexdigest()
    with AtomicFile(path) as file:
        _pump(response, check, file)
        if check.hexdigest() == expected:
            file.commit()
    return path, check.hexdigest()


def _pump(response, check, sink):
    expected = response.getheader("Content-Length")
    size = 0
    while True:
        block = response.read(_http.BLOCK_BYTES)
        if not block:
            break
        check.update(block)
        sink.write(block)
        size += len(block)
    if expected is not None and size != int(expected):
        raise OSError(f"the download ended after {size} of {expected} bytes")
