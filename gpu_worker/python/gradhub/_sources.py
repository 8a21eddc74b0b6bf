"""What save_checkpoint() may be given (bytes, a path, a binary file object), read in blocks
with its digest, and files written whole or not at all."""

import io
import os
import tempfile

from ._checksums import Sha256
from ._http import BLOCK_BYTES


class ExactReader:
    """`size` bytes of `file` from where it is, for http.client to send in blocks; fewer
    bytes (the file shrank since it was hashed) raise instead of sending a short body."""

    def __init__(self, file, size):
        self.file, self.left = file, size

    def read(self, limit=BLOCK_BYTES):
        if self.left == 0:
            return b""
        data = self.file.read(min(limit, self.left))
        if not data:
            raise OSError(f"the checkpoint's file ended {self.left} bytes early while sending")
        self.left -= len(data)
        return data


class Source:
    """The bytes to save, readable again for each try of an upload: open() gives a fresh
    binary file positioned at the first byte, to be closed by the caller."""

    def __init__(self, data):
        self.close_after = None
        if isinstance(data, (bytes, bytearray, memoryview)):
            self.data = bytes(data) if not isinstance(data, bytes) else data
            self.kind = "bytes"
        elif isinstance(data, (str, os.PathLike)):
            self.path = os.fspath(data)
            self.kind = "path"
        elif hasattr(data, "read"):
            self._take_file(data)
        else:
            raise ValueError("data: must be bytes, a path (str or os.PathLike) or a binary file "
                             f"object, not {type(data).__name__}")

    def _take_file(self, file):
        seekable = getattr(file, "seekable", lambda: False)()
        if seekable:
            self.file, self.start, self.kind = file, file.tell(), "file"
            return
        # Read once (a pipe, a socket): kept in a temporary file, read again for each try.
        spool = tempfile.TemporaryFile()
        while True:
            block = file.read(BLOCK_BYTES)
            if not block:
                break
            if not isinstance(block, (bytes, bytearray)):
                raise ValueError("data: a file object must be opened in binary mode")
            spool.write(block)
        self.file, self.start, self.kind, self.close_after = spool, 0, "file", spool

    def open(self):
        if self.kind == "bytes":
            return io.BytesIO(self.data)
        if self.kind == "path":
            return open(self.path, "rb")
        self.file.seek(self.start)
        return _Unclosed(self.file)

    def measure(self, check):
        """(size, hex digest of `check`, a fresh _checksums object) of the bytes as they are
        now."""
        if self.kind == "bytes":
            check.update(self.data)
            return len(self.data), check.hexdigest()
        with self.open() as file:
            return copy_hashing(file, None, check)

    def close(self):
        if self.close_after is not None:
            self.close_after.close()


class _Unclosed:
    """A caller's file object, which open()'s `with` must not close."""

    def __init__(self, file):
        self.file = file

    def read(self, limit=-1):
        data = self.file.read(limit)
        if not isinstance(data, (bytes, bytearray)):
            raise ValueError("data: a file object must be opened in binary mode")
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def copy_hashing(reader, writer, check=None):
    """Copies `reader` to `writer` (None: nowhere) in blocks; returns (size, hex digest) of
    `check` (a fresh _checksums object; None: SHA-256)."""
    check, size = check if check is not None else Sha256(), 0
    while True:
        block = reader.read(BLOCK_BYTES)
        if not block:
            return size, check.hexdigest()
        check.update(block)
        size += len(block)
        if writer is not None:
            writer.write(block)


class AtomicFile:
    """A file at `path` that appears whole (fsync, rename, fsync of the folder) at commit(),
    or not at all: closing without commit() removes what was written."""

    def __init__(self, path):
        self.path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        handle, self.temp = tempfile.mkstemp(
            dir=folder, prefix="." + os.path.basename(self.path) + ".", suffix=".tmp")
        self.file = os.fdopen(handle, "wb")

    def write(self, data):
        self.file.write(data)

    def commit(self):
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.temp, self.path)
        self.temp = None
        fsync_folder(self.folder)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.file.closed:
            self.file.close()
        if self.temp is not None:
            try:
                os.unlink(self.temp)
            except FileNotFoundError:
                pass
        return False


def fsync_folder(folder):
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
