"""report()'s steps as telemetry: TelemetryBatches (proto/gradhub/v1/telemetry.proto, in the
proto3 JSON mapping) posted to gradhub-metrics' POST /v1/telemetry with the rank's job token,
so that a script's loss, learning rate and throughput show in Prometheus as a trainer's do
(gradhub_training_loss{job_id,rank}, ...). On only when GRADHUB_METRICS_URL is set.

It never blocks or fails training:
  1. report() appends the step to a bounded queue and returns: no I/O, no waiting. When the
     queue is full the oldest step goes, counted in the batches' dropped_steps.
  2. A daemon thread posts the queue, up to BATCH_STEPS steps a POST, once BATCH_STEPS are
     queued or the oldest has waited BATCH_SECONDS; a POST has TIMEOUT_SECONDS.
  3. A failure that may pass (no connection, 429, 5xx) puts the steps back and waits, doubling
     from FIRST_WAIT_SECONDS to MAX_WAIT_SECONDS; one that will not (another 4xx: the token's
     attempt has ended, a wrong URL) ends telemetry in this process, said once on stderr.
  4. At interpreter exit what is queued gets EXIT_FLUSH_SECONDS at most to go.
A step sent twice (its answer lost) is dropped by gradhub-metrics as a duplicate.

A value report() is not given is the last one this process gave (0 before the first; the
learning rate NaN, which leaves the job's gauge to the ranks that report one).
"""

import atexit
import collections
import json
import math
import os
import random
import ssl
import sys
import threading
import time

from . import _http

QUEUE_STEPS = 1000
BATCH_STEPS = 16
BATCH_SECONDS = 1.0
TIMEOUT_SECONDS = 2.0
FIRST_WAIT_SECONDS = 0.5
MAX_WAIT_SECONDS = 8.0
EXIT_FLUSH_SECONDS = 1.0

# report()'s arguments carried from step to step: (StepTelemetry's JSON name, argument,
# value before the first report that gives it).
_CARRIED = (
    ("epoch", "epoch", 0),
    ("loss", "loss", 0.0),
    ("learningRate", "learning_rate", math.nan),
    ("samplesPerSecond", "samples_per_second", 0.0),
)


def _json_number(value):
    """A double as proto3 JSON has it: NaN and the infinities as strings."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _timestamp(seconds):
    """A google.protobuf.Timestamp in JSON: RFC 3339 in UTC."""
    whole = int(seconds)
    micros = int((seconds - whole) * 1e6)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + ".%06dZ" % micros


def _telemetry_of(wall_time, step, carried, metrics):
    """A queued step as a StepTelemetry in JSON."""
    telemetry = {"step": str(step), "time": _timestamp(wall_time)}
    for key, value in carried.items():
        telemetry[key] = value if key == "epoch" else _json_number(value)
    if metrics:
        telemetry["evalMetrics"] = {name: _json_number(v) for name, v in metrics.items()}
    return telemetry


class Reporter:
    """Sends one rank's steps to `server` (an _http.Server) on a thread of its own.
    Thread-safe: add() from any thread; close() once, at exit."""

    def __init__(self, server, job, attempt, rank, capacity=QUEUE_STEPS):
        self._server = server
        self._head = {"job": f"jobs/{job}", "attempt": attempt, "rank": rank}
        self._capacity = capacity
        self._cond = threading.Condition()
        # (monotonic time queued, wall time, step, carried values, metrics or None)
        self._queue = collections.deque()
        self._carried = {key: initial for key, _, initial in _CARRIED}
        self.dropped_steps = 0  # cumulative, as TelemetryBatch.dropped_steps
        self._closing = False
        self._stopped = False  # a refusal that will not pass
        self._not_before = 0.0  # monotonic time: no POST before it (a retry's wait)
        self._thread = threading.Thread(target=self._run, name="gradhub-telemetry", daemon=True)
        self._thread.start()

    def add(self, step, values, metrics):
        """Queues `step` with report()'s `values` (checked) and `metrics` ({name: float})."""
        with self._cond:
            for key, argument, _ in _CARRIED:
                if values.get(argument) is not None:
                    self._carried[key] = values[argument]
            if self._stopped:
                self.dropped_steps += 1
                return
            # As little as can be here: the sender thread makes the JSON (_telemetry_of).
            self._queue.append((time.monotonic(), time.time(), step, dict(self._carried),
                                metrics))
            self._trim()
            # The thread waits for a first step, then for a batch or the first one's age.
            if len(self._queue) == 1 or len(self._queue) == BATCH_STEPS:
                self._cond.notify()

    def close(self, timeout=EXIT_FLUSH_SECONDS):
        """Sends what is queued, for `timeout` seconds at most; the thread then ends."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _trim(self):
        while len(self._queue) > self._capacity:
            self._queue.popleft()
            self.dropped_steps += 1

    def _run(self):
        wait = FIRST_WAIT_SECONDS
        while True:
            with self._cond:
                batch = self._take()
                if batch is None:
                    return
                dropped = self.dropped_steps
            body = dict(self._head, steps=[_telemetry_of(*queued[1:]) for queued in batch],
                        droppedSteps=str(dropped))
            failure = self._post(body)
            if failure is None:
                wait = FIRST_WAIT_SECONDS
                continue
            with self._cond:
                if not failure.passes or self._closing:
                    self._stop(failure, dropping=len(batch))
                    return
                self._queue.extendleft(reversed(batch))  # in step order, before newer steps
                self._trim()
                self._not_before = time.monotonic() + random.uniform(wait / 2, wait)
            wait = min(wait * 2, MAX_WAIT_SECONDS)

    def _take(self):
        """Under the lock: the next batch once it is due (step 2, and not before a retry's
        wait is over) or at once when closing; None when closing with nothing left, or
        stopped. Steps that arrive meanwhile wake it, but do not make it due sooner."""
        while not self._stopped:
            if self._closing and not self._queue:
                return None
            if not self._queue:
                self._cond.wait()
                continue
            due = self._not_before
            if len(self._queue) < BATCH_STEPS:
                due = max(due, self._queue[0][0] + BATCH_SECONDS)
            wait = due - time.monotonic()
            if wait <= 0 or self._closing:
                return [self._queue.popleft()
                        for _ in range(min(BATCH_STEPS, len(self._queue)))]
            self._cond.wait(wait)
        return None

    def _post(self, body):
        """One POST: None when it was answered 200, else a _Failure."""
        try:
            connection = self._server.connect()
            try:
                connection.request("POST", self._server.path("/v1/telemetry"),
                                   body=json.dumps(body, allow_nan=False).encode(),
                                   headers=self._server.headers(
                                       {"Content-Type": "application/json"}))
                response = connection.getresponse()
                answer = response.read()
            finally:
                connection.close()
        except ssl.SSLCertVerificationError as failed:  # will not pass by itself
            return _Failure(f"the server's certificate: {failed} (GRADHUB_TLS_CA names the CA "
                            "that signed it)", passes=False)
        except Exception as failed:  # whatever it is, it must not reach training
            return _Failure(f"{type(failed).__name__}: {failed}", passes=True)
        if response.status == 200:
            return None
        error = _http.error_of(response, answer, "POST /v1/telemetry")
        return _Failure(str(error), passes=_http.retryable(error))

    def _stop(self, failure, dropping):
        """Under the lock: no more sending in this process; what is queued is dropped."""
        self.dropped_steps += dropping + len(self._queue)
        self._queue.clear()
        if self._stopped:
            return
        self._stopped = True
        if not self._closing:
            _say(f"telemetry stopped ({failure.message}); training goes on without it")


class _Failure:
    def __init__(self, message, passes):
        self.message, self.passes = message, passes


def _say(message):
    try:
        sys.stderr.write(f"gradhub: {message}\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr must not fail a report
        pass


# This process's reporter: (pid, Reporter or None), made at the first report(); a forked child
# (a DataLoader worker that reports) makes its own, since it has not the parent's thread.
_state = None
_state_lock = threading.Lock()


def record(step, values, metrics):
    """report()'s step as telemetry, when GRADHUB_METRICS_URL is set. Never raises."""
    reporter = _reporter()
    if reporter is not None:
        reporter.add(step, values, metrics)


def shutdown(timeout=EXIT_FLUSH_SECONDS):
    """Flushes and forgets this process's reporter (atexit; tests)."""
    global _state
    with _state_lock:
        state, _state = _state, None
    if state is not None and state[0] == os.getpid() and state[1] is not None:
        state[1].close(timeout)


def _reporter():
    global _state
    state = _state
    if state is not None and state[0] == os.getpid():
        return state[1]
    with _state_lock:
        if _state is None or _state[0] != os.getpid():
            _state = (os.getpid(), _start())
        return _state[1]


def _start():
    """A Reporter for this rank from gradhub's environment; None (said once) without one."""
    url = os.environ.get("GRADHUB_METRICS_URL", "")
    if not url:
        return None
    missing = [name for name in ("GRADHUB_JOB_TOKEN", "GRADHUB_JOB_ID", "GRADHUB_ATTEMPT",
                                 "GRADHUB_RANK") if not os.environ.get(name)]
    if missing:
        _say(f"telemetry off: GRADHUB_METRICS_URL is set but {', '.join(missing)} is not "
             "(gradhub's agent sets them all for every rank)")
        return None
    try:
        server = _http.Server(url, os.environ["GRADHUB_JOB_TOKEN"], os.environ.get("GRADHUB_TLS_CA"),
                              variable="GRADHUB_METRICS_URL", timeout=TIMEOUT_SECONDS)
        attempt, rank = int(os.environ["GRADHUB_ATTEMPT"]), int(os.environ["GRADHUB_RANK"])
    except (ValueError, OSError, _http.CheckpointError) as error:
        _say(f"telemetry off: {error}")
        return None
    job = os.environ["GRADHUB_JOB_ID"].removeprefix("jobs/")
    reporter = Reporter(server, job, attempt, rank)
    atexit.register(shutdown)
    return reporter
