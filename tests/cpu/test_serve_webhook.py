"""The service's webhook sink (toolchain.serve.webhook) against a real HTTP receiver on 127.0.0.1 (the standard
library's server, in the test): batches arrive in order; while the receiver answers 503 or is gone, messages are
spooled and publishing never waits; when it is back the spool goes first, and the receiver holds every message, in
order; a stop with the receiver gone keeps the queue for the next start."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from toolchain.serve.spool import Spool
from toolchain.serve.webhook import WebhookSink


class Receiver:
    """POSTs recorded in ``batches`` (each a list of documents); ``status`` is what it answers; ``down()`` and
    ``up()`` close and reopen its port."""

    def __init__(self):
        self.batches: list[list[dict]] = []
        self.status = 200
        self.port = 0
        self.up()

    def up(self):
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if owner.status == 200:
                    owner.batches.append(json.loads(body))
                self.send_response(owner.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def down(self):
        self.server.shutdown()
        self.server.server_close()

    def frames(self) -> list[int]:
        return [d["payload"]["frame"] for batch in list(self.batches) for d in batch]

    def wait_for(self, n: int, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(set(self.frames())) >= n:
                return True
            time.sleep(0.05)
        return False


def _result(i: int) -> dict:
    return {"camera": "door", "frame": i, "received": time.time(), "top_k": [{"label": "unicycle", "score": 0.5}]}


def _in_order_without_gap(frames, n):
    first = list(dict.fromkeys(frames))
    assert first == list(range(n)), (len(first), first[:5], first[-5:])


def test_batches_in_order_through_a_503_spell_and_a_receiver_gone_and_back(tmp_path):
    receiver = Receiver()
    sink = WebhookSink(f"http://127.0.0.1:{receiver.port}/trtc", spool=Spool(tmp_path / "spool"), batch=20,
                       backoff_max=0.5)
    sink.start()
    try:
        for i in range(100):
            sink.publish("door/result", _result(i))
        assert receiver.wait_for(100)
        assert max(len(b) for b in receiver.batches) > 1  # batched
        assert receiver.batches[0][0]["topic"] == "door/result"
        receiver.status = 503
        started = time.monotonic()
        for i in range(100, 200):
            sink.publish("door/result", _result(i))
        time.sleep(1.0)
        receiver.down()
        for i in range(200, 300):
            sink.publish("door/result", _result(i))
        assert time.monotonic() - started < 3  # never waited on the receiver
        time.sleep(1.0)
        assert sink.count("spooled") >= 150 and sink.failures >= 2
        receiver.status = 200
        receiver.up()
        for i in range(300, 350):
            sink.publish("door/result", _result(i))
        assert receiver.wait_for(350), len(set(receiver.frames()))
        _in_order_without_gap(receiver.frames(), 350)
    finally:
        sink.stop()
        receiver.down()


def test_a_stop_with_the_receiver_gone_keeps_the_queue_for_the_next_start(tmp_path):
    receiver = Receiver()
    receiver.down()
    sink = WebhookSink(f"http://127.0.0.1:{receiver.port}/trtc", spool=Spool(tmp_path / "spool"), backoff_max=0.5)
    sink.start()
    for i in range(40):
        sink.publish("door/event", _result(i))
    sink.stop(timeout=1)
    assert len(Spool(tmp_path / "spool")) == 40
    receiver.up()
    again = WebhookSink(f"http://127.0.0.1:{receiver.port}/trtc", spool=Spool(tmp_path / "spool"))
    again.start()
    again.publish("door/event", _result(40))
    try:
        assert receiver.wait_for(41), len(set(receiver.frames()))
        _in_order_without_gap(receiver.frames(), 41)
    finally:
        again.stop()
        receiver.down()
