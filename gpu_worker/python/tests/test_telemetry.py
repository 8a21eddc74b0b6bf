"""report()'s telemetry (gradhub/_telemetry.py) against a scripted HTTP server on loopback:
what it posts, that it retries what may pass and stops at what will not, counts what it
drops, and that a dead or silent server never raises in report(), never slows it, and holds
the interpreter's exit for about a second at most. gradhub-metrics' side of the same POST is
tests/integration/metrics/telemetry_rest_test.cc."""

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import gradhub
from gradhub import _telemetry


class Metrics(BaseHTTPRequestHandler):
    """gradhub-metrics as scripted: each POST gets the next of the server's `answers`
    ((status, body); 200 when none is left) and is kept in its `posts` as (headers, JSON)."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.posts.append((dict(self.headers), json.loads(body), self.path))
            status, answer = (self.server.answers.pop(0) if self.server.answers
                              else (200, b'{"acceptedSteps":"1"}'))
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def error(status, code, message):
    return json.dumps({"error": {"code": status, "status": code, "message": message}}).encode()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(url):
    return {"GRADHUB_METRICS_URL": url, "GRADHUB_JOB_TOKEN": "ghj_test",
            "GRADHUB_JOB_ID": "j1", "GRADHUB_ATTEMPT": "2", "GRADHUB_RANK": "1"}


class TelemetryTest(unittest.TestCase):
    def setUp(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
        self.server.answers, self.server.posts = [], []
        self.server.lock = threading.Lock()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.addCleanup(self.server.server_close)
        self.addCleanup(self.server.shutdown)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.patch_env(rank_env(self.url))
        for name, value in (("BATCH_SECONDS", 0.05), ("FIRST_WAIT_SECONDS", 0.02)):
            patcher = mock.patch.object(_telemetry, name, value)
            patcher.start()
            self.addCleanup(patcher.stop)
        self.addCleanup(_telemetry.shutdown)
        _telemetry.shutdown()  # a reporter of an earlier test's environment

    def patch_env(self, env):
        patcher = mock.patch.dict(os.environ, env)
        patcher.start()
        self.addCleanup(patcher.stop)

    def report(self, *args, **kwargs):
        with contextlib.redirect_stdout(io.StringIO()):
            gradhub.report(*args, **kwargs)

    def steps_posted(self):
        with self.server.lock:
            return [step for _, body, _ in self.server.posts for step in body["steps"]]

    def await_steps(self, count, limit=5.0):
        deadline = time.monotonic() + limit
        while len(self.steps_posted()) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.steps_posted()

    def test_report_posts_its_steps_as_the_ranks_telemetry(self):
        self.report(1, 2.5, epoch=0, learning_rate=0.1, samples_per_second=300.0)
        self.report(2, 2.0, metrics={"accuracy": 0.75})
        self.report(3, float("nan"))
        steps = self.await_steps(3)
        headers, body, path = self.server.posts[0]
        self.assertEqual(path, "/v1/telemetry")
        self.assertEqual(headers["Authorization"], "Bearer ghj_test")
        self.assertEqual(headers["Content-Type"], "application/json")
        self.assertEqual((body["job"], body["attempt"], body["rank"]), ("jobs/j1", 2, 1))
        self.assertEqual(body["droppedSteps"], "0")
        self.assertEqual([step["step"] for step in steps], ["1", "2", "3"])
        self.assertEqual({k: steps[0][k] for k in ("epoch", "loss", "learningRate",
                                                   "samplesPerSecond")},
                         {"epoch": 0, "loss": 2.5, "learningRate": 0.1, "samplesPerSecond": 300.0})
        # What a step is not given is the last one given; a NaN loss is proto3 JSON's "NaN".
        self.assertEqual((steps[1]["loss"], steps[1]["learningRate"]), (2.0, 0.1))
        self.assertEqual(steps[1]["evalMetrics"], {"accuracy": 0.75})
        self.assertNotIn("evalMetrics", steps[2])
        self.assertEqual(steps[2]["loss"], "NaN")
        self.assertRegex(steps[0]["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")

    def test_a_learning_rate_never_given_is_nan_and_a_batch_holds_a_few_steps(self):
        for step in range(1, 41):
            self.report(step, 1.0)
        steps = self.await_steps(40)
        self.assertEqual([int(step["step"]) for step in steps], list(range(1, 41)))
        self.assertEqual(steps[0]["learningRate"], "NaN")
        self.assertTrue(all(len(body["steps"]) <= _telemetry.BATCH_STEPS
                            for _, body, _ in self.server.posts))
        self.assertLess(len(self.server.posts), 40)

    def test_a_503_is_retried_with_the_same_steps(self):
        self.server.answers = [(503, error(503, "UNAVAILABLE", "busy"))]
        self.report(7, 1.0)
        self.await_steps(2)
        self.assertEqual([step["step"] for step in self.steps_posted()], ["7", "7"])

    def test_a_server_that_keeps_failing_is_asked_again_after_growing_waits_only(self):
        self.server.answers = [(503, error(503, "UNAVAILABLE", "busy"))] * 1000
        for step in range(300):  # 0.6 s of steps, 2 ms each
            self.report(step, 1.0)
            time.sleep(0.002)
        # Waits of 0.02 s doubling: a handful of POSTs, not one per step or per batch.
        self.assertLessEqual(len(self.server.posts), 8)
        self.assertGreaterEqual(len(self.server.posts), 2)

    def test_a_refusal_that_will_not_pass_stops_telemetry_and_training_goes_on(self):
        self.server.answers = [(403, error(403, "PERMISSION_DENIED", "rank: not yours"))]
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            self.report(1, 1.0)
            self.await_steps(1)
            time.sleep(0.2)
            for step in range(2, 6):
                self.report(step, 1.0)
            time.sleep(0.3)
        self.assertEqual(len(self.server.posts), 1)
        self.assertEqual(stderr.getvalue().count("telemetry stopped"), 1)
        self.assertIn("HTTP 403 PERMISSION_DENIED: rank: not yours", stderr.getvalue())
        self.assertEqual(_telemetry._reporter().dropped_steps, 5)

    def test_a_full_queue_drops_the_oldest_and_counts_them(self):
        reporter = _telemetry.Reporter(_telemetry._http.Server(self.url, "ghj_test"), "j1", 2, 1,
                                       capacity=4)
        with mock.patch.object(_telemetry, "BATCH_SECONDS", 0.5):
            for step in range(1, 11):
                reporter.add(step, {"loss": 1.0}, None)
            self.assertEqual(reporter.dropped_steps, 6)
            steps = self.await_steps(4)
        reporter.close()
        self.assertEqual([step["step"] for step in steps], ["7", "8", "9", "10"])
        self.assertEqual(self.server.posts[0][1]["droppedSteps"], "6")

    def test_a_dead_server_never_raises_nor_slows_report(self):
        self.patch_env({"GRADHUB_METRICS_URL": f"http://127.0.0.1:{free_port()}"})
        slowest, start = 0.0, time.monotonic()
        for step in range(5000):
            before = time.monotonic()
            self.report(step, 1.0, metrics={"a": 1.0})
            slowest = max(slowest, time.monotonic() - before)
        total = time.monotonic() - start
        self.assertLess(total, 2.0)  # tens of microseconds a report (loose for a loaded host)
        self.assertLess(slowest, 0.1)
        begun = time.monotonic()
        _telemetry.shutdown()
        self.assertLess(time.monotonic() - begun, _telemetry.EXIT_FLUSH_SECONDS + 0.5)

    def test_outside_gradhub_nothing_is_sent(self):
        self.patch_env({"GRADHUB_METRICS_URL": ""})
        self.report(1, 1.0)
        time.sleep(0.2)
        self.assertEqual(self.server.posts, [])
        self.assertIsNone(_telemetry._reporter())


class ExitTest(unittest.TestCase):
    """The interpreter's exit, in a process of its own, as a rank ends."""

    def run_rank(self, url, steps):
        code = ("import gradhub\n"
                f"for step in range({steps}):\n"
                "    gradhub.report(step, 0.5)\n")
        env = dict(os.environ, **rank_env(url))
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=30)
        return done, time.monotonic() - start

    def test_a_silent_server_holds_the_exit_about_a_second_at_most(self):
        # It accepts connections (the backlog) and never answers.
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(16)
            done, seconds = self.run_rank(f"http://127.0.0.1:{silent.getsockname()[1]}", 100)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(len(done.stdout.splitlines()), 100)
        quick, quick_seconds = self.run_rank("", 100)  # the same without telemetry
        self.assertLess(seconds - quick_seconds, _telemetry.EXIT_FLUSH_SECONDS + 0.5)

    def test_the_last_steps_are_sent_at_exit(self):
        server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
        server.answers, server.posts, server.lock = [], [], threading.Lock()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        done, _ = self.run_rank(f"http://127.0.0.1:{server.server_port}", 3)
        self.assertEqual(done.returncode, 0, done.stderr)
        steps = [step["step"] for _, body, _ in server.posts for step in body["steps"]]
        self.assertEqual(steps, ["0", "1", "2"])


if __name__ == "__main__":
    unittest.main()
