"""The gradhub module alone: report()'s lines, the local checkpoint folder, and the REST
client's retry and answer handling against a scripted HTTP server on loopback. The module
against the real checkpoint store is tests/integration/checkpoint/script_module_test.cc."""

import contextlib
import hashlib
import io
import json
import os
import tempfile
import threading
import unittest
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import gradhub
from gradhub import _checksums, _http


def printed(call):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        call()
    return out.getvalue()


class ReportTest(unittest.TestCase):
    def test_keys_in_the_trainers_order_with_nine_significant_digits(self):
        line = printed(lambda: gradhub.report(
            12, 0.123456789123, epoch=2, learning_rate=1e-05, samples_per_second=12345.678901,
            total_steps=1000))
        self.assertEqual(
            line, '{"event":"progress","step":12,"totalSteps":1000,"epoch":2,'
                  '"loss":0.123456789,"lr":1e-05,"samplesPerSecond":12345.6789}\n')

    def test_unset_values_are_left_out_and_non_finite_ones_are_null(self):
        self.assertEqual(printed(lambda: gradhub.report(0)), '{"event":"progress","step":0}\n')
        self.assertEqual(printed(lambda: gradhub.report(3, float("nan"))),
                         '{"event":"progress","step":3,"loss":null}\n')

    def test_metrics_add_an_eval_record_sorted_by_name_and_escaped(self):
        lines = printed(lambda: gradhub.report(
            5, 1, metrics={"top5": 0.5, "acc": float("inf"), 'a"b\n': 2})).splitlines()
        self.assertEqual(lines, [
            '{"event":"progress","step":5,"loss":1}',
            '{"event":"eval","step":5,"eval.a\\"b\\n":2,"eval.acc":null,"eval.top5":0.5}',
        ])
        for line in lines:
            json.loads(line)

    def test_wrong_arguments_name_themselves(self):
        for call, name in [
            (lambda: gradhub.report(-1), "step"),
            (lambda: gradhub.report(1.5), "step"),
            (lambda: gradhub.report(True), "step"),
            (lambda: gradhub.report(1, "low"), "loss"),
            (lambda: gradhub.report(1, epoch=0.5), "epoch"),
            (lambda: gradhub.report(1, metrics={"": 1.0}), "metrics"),
            (lambda: gradhub.report(1, metrics=[1.0]), "metrics"),
        ]:
            with self.assertRaises(ValueError) as raised:
                printed(call)
            self.assertTrue(str(raised.exception).startswith(name), raised.exception)

    def test_ranks_default_outside_torchrun(self):
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertEqual((gradhub.rank(), gradhub.world_size(), gradhub.local_rank()),
                             (0, 1, 0))
        with mock.patch.dict(os.environ, {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}):
            self.assertEqual((gradhub.rank(), gradhub.world_size(), gradhub.local_rank()),
                             (3, 4, 1))


class LocalFolderTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.folder = os.path.join(self.dir.name, "checkpoints")
        patcher = mock.patch.dict(os.environ, {"GRADHUB_CHECKPOINT_DIR": self.folder})
        patcher.start()
        self.addCleanup(patcher.stop)
        for name in ("GRADHUB_CHECKPOINT_URL", "GRADHUB_JOB_TOKEN"):
            os.environ.pop(name, None)
        self.addCleanup(self.dir.cleanup)

    def test_saves_bytes_paths_and_files_keeps_three_and_loads_the_newest(self):
        self.assertIsNone(gradhub.load_latest_checkpoint())
        gradhub.save_checkpoint(10, b"ten")
        source = os.path.join(self.dir.name, "state.bin")
        with open(source, "wb") as file:
            file.write(os.urandom(3 << 20))
        gradhub.save_checkpoint(20, source)
        with open(source, "rb") as file:
            gradhub.save_checkpoint(30, file)
        read, write = os.pipe()
        os.write(write, b"from a pipe")
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            gradhub.save_checkpoint(40, pipe)
        self.assertEqual(gradhub.load_latest_checkpoint(), (40, b"from a pipe"))
        self.assertEqual(sorted(os.listdir(self.folder))[0], "step-00000000000000000020.ckpt")
        self.assertEqual(len(os.listdir(self.folder)), 6)

    def test_a_step_is_saved_once(self):
        self.assertEqual(gradhub.save_checkpoint(7, b"same"), 7)
        self.assertEqual(gradhub.save_checkpoint(7, b"same"), 7)
        with self.assertRaises(gradhub.CheckpointError) as raised:
            gradhub.save_checkpoint(7, b"other")
        self.assertIn("already has a checkpoint", str(raised.exception))
        self.assertEqual(gradhub.load_latest_checkpoint(), (7, b"same"))

    def test_a_load_into_a_path_checks_the_sha256(self):
        gradhub.save_checkpoint(1, b"x" * 1000)
        out = os.path.join(self.dir.name, "restored.bin")
        self.assertEqual(gradhub.load_latest_checkpoint(out), (1, out))
        with open(out, "rb") as file:
            self.assertEqual(file.read(), b"x" * 1000)
        with open(os.path.join(self.folder, "step-00000000000000000001.ckpt"), "r+b") as file:
            file.write(b"y")
        os.unlink(out)
        with self.assertRaises(gradhub.CheckpointError):
            gradhub.load_latest_checkpoint(out)
        self.assertFalse(os.path.exists(out))  # nothing half-written is left

    def test_a_gradhub_rank_without_a_store_url_is_refused(self):
        rank = {"GRADHUB_JOB_TOKEN": "ghj_x", "GRADHUB_CHECKPOINT_URL": ""}
        with mock.patch.dict(os.environ, rank):
            with self.assertRaises(gradhub.CheckpointError) as raised:
                gradhub.save_checkpoint(1, b"x")
        self.assertIn("--checkpoint-url", str(raised.exception))
        self.assertFalse(os.path.exists(self.folder))

    def test_wrong_data_is_a_value_error(self):
        with self.assertRaises(ValueError):
            gradhub.save_checkpoint(1, 12)
        with self.assertRaises(ValueError):
            gradhub.save_checkpoint(-1, b"")


class Scripted(BaseHTTPRequestHandler):
    """Answers each request with the next of the server's `answers`: (status, headers, body),
    and records (method, path, headers, body) in its `requests`."""

    def do_any(self):
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        self.server.requests.append((self.command, self.path, dict(self.headers), body))
        status, headers, answer = self.server.answers.pop(0)
        if callable(answer):
            answer = answer()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_PUT = do_any

    def log_message(self, *args):
        pass


def error(status, code, message):
    return json.dumps({"error": {"code": status, "status": code, "message": message}}).encode()


class RestClientTest(unittest.TestCase):
    def setUp(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
        self.server.answers, self.server.requests = [], []
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        self.addCleanup(self.server.server_close)
        self.addCleanup(self.server.shutdown)
        env = {"GRADHUB_CHECKPOINT_URL": f"http://127.0.0.1:{self.server.server_port}",
               "GRADHUB_JOB_TOKEN": "ghj_test", "GRADHUB_JOB_ID": "jobs/j1",
               "GRADHUB_ATTEMPT": "2"}
        for patcher in (mock.patch.dict(os.environ, env),
                        mock.patch.object(_http, "FIRST_WAIT_SECONDS", 0.01)):
            patcher.start()
            self.addCleanup(patcher.stop)

    def test_a_save_retries_a_503_and_sends_the_bytes_with_their_sha256(self):
        self.server.answers = [(503, {}, error(503, "UNAVAILABLE", "busy")),
                               (200, {}, b'{"step": "5"}')]
        self.assertEqual(gradhub.save_checkpoint(5, b"payload"), 5)
        method, path, headers, body = self.server.requests[-1]
        self.assertEqual((method, path, body), ("PUT", "/v1/jobs/j1/checkpoints/5?attempt=2",
                                                b"payload"))
        self.assertEqual(headers["X-Checkpoint-Sha256"], hashlib.sha256(b"payload").hexdigest())
        self.assertEqual(headers["Authorization"], "Bearer ghj_test")
        self.assertEqual(len(self.server.requests), 2)

    def test_a_409_is_a_success_only_for_the_same_bytes(self):
        ours = hashlib.sha256(b"payload").hexdigest()
        self.server.answers = [
            (409, {"X-Checkpoint-Sha256": ours}, error(409, "ALREADY_EXISTS", "exists")),
            (409, {"X-Checkpoint-Sha256": "0" * 64}, error(409, "ALREADY_EXISTS", "exists"))]
        self.assertEqual(gradhub.save_checkpoint(5, b"payload"), 5)
        with self.assertRaises(gradhub.CheckpointError) as raised:
            gradhub.save_checkpoint(5, b"payload")
        self.assertIn("other bytes", str(raised.exception))

    def test_an_error_that_stays_names_the_status_and_the_servers_message(self):
        self.server.answers = [(401, {}, error(401, "UNAUTHENTICATED", "invalid token"))]
        with self.assertRaises(gradhub.CheckpointError) as raised:
            gradhub.save_checkpoint(5, b"payload")
        self.assertEqual(str(raised.exception),
                         "save_checkpoint(step=5): HTTP 401 UNAUTHENTICATED: invalid token")
        self.assertEqual(len(self.server.requests), 1)  # not retried

    def test_retries_end_after_a_few_tries(self):
        self.server.answers = [(500, {}, error(500, "INTERNAL", "down"))] * _http.TRIES
        with self.assertRaises(gradhub.CheckpointError) as raised:
            gradhub.save_checkpoint(5, b"payload")
        self.assertIn("HTTP 500 INTERNAL: down", str(raised.exception))
        self.assertEqual(len(self.server.requests), _http.TRIES)

    def test_a_load_without_checkpoints_is_none(self):
        self.server.answers = [(404, {}, error(404, "NOT_FOUND", "no committed checkpoint"))]
        self.assertIsNone(gradhub.load_latest_checkpoint())

    def test_a_mismatch_is_asked_once_more_with_the_server_checking_then_raises(self):
        data = b"checkpoint bytes"
        sha = hashlib.sha256(data).hexdigest()
        latest = json.dumps({"name": "jobs/j1/checkpoints/8", "step": "8", "sha256": sha}).encode()
        self.server.answers = [(200, {}, latest), (200, {"X-Checkpoint-Sha256": sha}, b"garbled"),
                               (200, {}, latest), (200, {"X-Checkpoint-Sha256": sha}, data)]
        self.assertEqual(gradhub.load_latest_checkpoint(), (8, data))
        self.assertEqual(self.server.requests[3][1],
                         "/v1/jobs/j1/checkpoints/8:download?verifySha256=true")
        garbled = (200, {"X-Checkpoint-Sha256": sha}, b"garbled")
        self.server.answers = [(200, {}, latest), garbled] * 2
        with self.assertRaises(gradhub.CheckpointError):
            gradhub.load_latest_checkpoint()


class FakeEngine:
    """gradhub._C's crc32c for the plumbing: zlib's CRC-32 stands in for CRC-32C (the real one
    is checked against the store in script_module_test)."""

    @staticmethod
    def crc32c(data, crc=0):
        return zlib.crc32(data, crc)


class WithTheEngineTest(unittest.TestCase):
    """Where gradhub's engine is loaded, saves and loads are checked by CRC-32C (_checksums),
    against the same scripted server as RestClientTest."""

    def setUp(self):
        RestClientTest.setUp(self)
        patcher = mock.patch.object(_checksums, "_loaded_engine", lambda: FakeEngine)
        patcher.start()
        self.addCleanup(patcher.stop)

    def test_a_save_sends_the_crc32c_and_a_409_of_the_same_bytes_succeeds(self):
        ours = f"{zlib.crc32(b'payload'):08x}"
        self.server.answers = [
            (200, {}, b'{"step": "5"}'),
            (409, {"X-Checkpoint-Crc32c": ours, "X-Checkpoint-Sha256": "0" * 64},
             error(409, "ALREADY_EXISTS", "exists")),
            (409, {"X-Checkpoint-Crc32c": "00000000"}, error(409, "ALREADY_EXISTS", "exists"))]
        self.assertEqual(gradhub.save_checkpoint(5, b"payload"), 5)
        headers = self.server.requests[0][2]
        self.assertEqual(headers["X-Checkpoint-Crc32c"], ours)
        self.assertNotIn("X-Checkpoint-Sha256", headers)
        self.assertEqual(gradhub.save_checkpoint(5, b"payload"), 5)
        with self.assertRaises(gradhub.CheckpointError) as raised:
            gradhub.save_checkpoint(5, b"payload")
        self.assertIn("other bytes", str(raised.exception))

    def test_a_load_checks_the_crc32c_and_asks_again_on_a_mismatch(self):
        data = b"checkpoint bytes"
        crc = zlib.crc32(data)
        latest = json.dumps({"name": "jobs/j1/checkpoints/8", "step": "8", "sha256": "0" * 64,
                             "crc32c": crc}).encode()
        announced = {"X-Checkpoint-Crc32c": f"{crc:08x}", "X-Checkpoint-Sha256": "0" * 64}
        self.server.answers = [(200, {}, latest), (200, announced, b"garbled"),
                               (200, {}, latest), (200, announced, data)]
        self.assertEqual(gradhub.load_latest_checkpoint(), (8, data))
        self.assertEqual(self.server.requests[3][1],
                         "/v1/jobs/j1/checkpoints/8:download?verifySha256=true")

    def test_a_checkpoint_without_a_crc32c_is_checked_by_its_sha256(self):
        data = b"older checkpoint"
        sha = hashlib.sha256(data).hexdigest()
        latest = json.dumps({"name": "jobs/j1/checkpoints/3", "step": "3", "sha256": sha}).encode()
        self.server.answers = [(200, {}, latest), (200, {"X-Checkpoint-Sha256": sha}, data)]
        self.assertEqual(gradhub.load_latest_checkpoint(), (3, data))


if __name__ == "__main__":
    unittest.main()
