"""The checkpoint store's REST API as the module uses it: requests with the rank's job token,
retried with jittered backoff, errors that say the HTTP status and the server's message."""

import http.client
import json
import random
import ssl
import time
import urllib.parse

# Blocks read from a file and sent in one write: large enough that Python's per-call overhead
# does not limit a GB-sized upload.
BLOCK_BYTES = 1 << 20
# Tries per call, the waits between them (doubling, each one randomized between half and all
# of it so that the ranks of a job do not retry in step), and a socket's patience: a commit
# hashes the whole checkpoint before it answers.
TRIES = 6
FIRST_WAIT_SECONDS = 0.5
MAX_WAIT_SECONDS = 8.0
SOCKET_TIMEOUT_SECONDS = 600.0


class CheckpointError(Exception):
    """A checkpoint call that failed for good: `status` is the HTTP status (0 when the server
    could not be reached), `code` the server's status name (e.g. "NOT_FOUND")."""

    def __init__(self, message, status=0, code=""):
        super().__init__(message)
        self.status = status
        self.code = code


class RetryableError(Exception):
    """A failure worth another try (429, 5xx, ABORTED, a broken connection): `error` says it."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


def error_of(response, body, what):
    """A CheckpointError for an answer that is not a success: HTTP status, code, message."""
    code, message = "", body.decode("utf-8", "replace").strip()
    try:
        error = json.loads(body)["error"]
        code, message = error.get("status", ""), error.get("message", message)
    except (ValueError, KeyError, TypeError):
        pass
    text = f"{what}: HTTP {response.status}"
    text += f" {code}: {message}" if code else f": {message or response.reason}"
    return CheckpointError(text, response.status, code)


def retryable(error):
    """Whether a CheckpointError may go away on its own."""
    return error.status == 429 or error.status >= 500 or error.code == "ABORTED"


class Server:
    """A gradhub REST server at `url` ("http://host:port" or "https://..."), as `token`:
    gradhub-checkpoint (the default), or gradhub-metrics with its `variable` and a short
    socket `timeout`."""

    def __init__(self, url, token, ca_file=None, variable="GRADHUB_CHECKPOINT_URL",
                 timeout=SOCKET_TIMEOUT_SECONDS):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise CheckpointError(f"{variable}: '{url}' is not http(s)://host:port")
        self.scheme, self.netloc = parsed.scheme, parsed.netloc
        self.prefix = parsed.path.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.context = None
        if self.scheme == "https":
            self.context = ssl.create_default_context(cafile=ca_file or None)

    def connect(self):
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.netloc, timeout=self.timeout,
                                               context=self.context, blocksize=BLOCK_BYTES)
        return http.client.HTTPConnection(self.netloc, timeout=self.timeout,
                                          blocksize=BLOCK_BYTES)

    def headers(self, extra=None):
        headers = {"Authorization": f"Bearer {self.token}", "User-Agent": "gradhub-python"}
        headers.update(extra or {})
        return headers

    def path(self, path):
        return self.prefix + path


def with_retries(what, call):
    """call() until it returns, at most TRIES times; it raises RetryableError for a failure
    worth another try. The last failure is raised as a CheckpointError."""
    wait = FIRST_WAIT_SECONDS
    for attempt in range(1, TRIES + 1):
        try:
            return call()
        except RetryableError as failed:
            last = failed.error
        except ssl.SSLCertVerificationError as failed:  # will not pass by itself
            raise CheckpointError(f"{what}: the store's certificate: {failed} (GRADHUB_TLS_CA "
                                  "names the CA that signed it)") from None
        except (OSError, http.client.HTTPException) as failed:
            last = CheckpointError(f"{what}: {type(failed).__name__}: {failed}")
        if attempt == TRIES:
            break
        time.sleep(random.uniform(wait / 2, wait))
        wait = min(wait * 2, MAX_WAIT_SECONDS)
    if isinstance(last, CheckpointError):
        raise CheckpointError(f"{last} (after {TRIES} tries)", last.status, last.code)
    raise last


def read_json(response, what):
    """The JSON of a 200 answer; a CheckpointError (or RetryableError) for any other."""
    body = response.read()
    if response.status == 200:
        return json.loads(body)
    raise_for(response, body, what)


def raise_for(response, body, what):
    error = error_of(response, body, what)
    if retryable(error):
        raise RetryableError(error)
    raise error
