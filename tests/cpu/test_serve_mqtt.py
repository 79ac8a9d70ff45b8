"""The service's MQTT sink (toolchain.serve.mqtt) against a real broker (Debian's mosquitto on 127.0.0.1): every
message reaches a subscriber in order with no gap across a broker restart (spooled meanwhile, then sent), a stop
with the broker down keeps the queue in the spool for the next start, and `available` says online, then offline,
also as the broker's last will for a process that was killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import mqtt_broker


@pytest.fixture
def mosquitto(tmp_path):
    """A real broker (TRTC_REQUIRE_REAL turns its skip into a failure: .ci/run installs mosquitto)."""
    if mqtt_broker.available():
        pytest.skip(mqtt_broker.available())
    pytest.importorskip("paho.mqtt.client", reason='needs paho-mqtt: pip install -e ".[dev]"')
    broker = mqtt_broker.Broker(tmp_path / "broker").start()
    yield broker
    broker.kill()


def _frames(messages, topic="trtc/door/result") -> list[int]:
    return [json.loads(p)["frame"] for t, p in messages if t == topic]


def _in_order_without_gap(frames: list[int], n: int) -> None:
    """Every frame 0..n-1 arrived, each first time in order (at-least-once: a repeat of a message the broker had
    not acknowledged when it stopped is allowed)."""
    first = list(dict.fromkeys(frames))
    assert first == list(range(n)), f"{len(first)} distinct of {n}; first out of order near {_first_bad(first)}"


def _first_bad(first):
    return next((i for i, (a, b) in enumerate(zip(first, first[1:])) if b != a + 1), None)


def _sink(port, spool_dir):
    from toolchain.serve.mqtt import MqttSink
    from toolchain.serve.spool import Spool

    return MqttSink("127.0.0.1", port, prefix="trtc", spool=Spool(spool_dir))


def _result(i: int) -> dict:
    return {"camera": "door", "frame": i, "time": i / 25, "received": time.time(),
            "top_k": [{"index": 880, "label": "unicycle", "score": 0.5}]}


def test_every_message_arrives_in_order_across_a_broker_restart(mosquitto, tmp_path):
    sub = mqtt_broker.Subscriber(mosquitto.port)  # subscribed: the broker keeps its session from here on
    sink = _sink(mosquitto.port, tmp_path / "spool")
    sink.start()
    try:
        assert sub.wait_for(lambda m: ("trtc/available", "online") in m, 10), sub.messages
        for i in range(100):
            sink.publish("door/result", _result(i))
        assert sub.wait_for(lambda m: len(set(_frames(m))) == 100, 15)
        mosquitto.stop()  # SIGTERM: it saves the subscriber's session
        started = time.monotonic()
        for i in range(100, 300):
            sink.publish("door/result", _result(i))
            time.sleep(0.002)
        assert time.monotonic() - started < 5  # publishing never waited on the dead broker
        assert sub.wait_for(lambda m: False, 0.5) is False
        assert sink.counts["spooled"] >= 150 and not sink.spool.empty(), sink.counts
        mosquitto.start()
        for i in range(300, 400):
            sink.publish("door/result", _result(i))
        assert sub.wait_for(lambda m: len(set(_frames(m))) == 400, 30), (len(set(_frames(sub.messages))), sink.counts)
        _in_order_without_gap(_frames(sub.messages), 400)
        deadline = time.monotonic() + 10  # the spool is acknowledged once the broker's last PUBACK is in
        while not sink.spool.empty() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sink.spool.empty() and sink.counts["sent_from_spool"] >= 150
    finally:
        sink.stop()
    assert sub.wait_for(lambda m: m and m[-1] == ("trtc/available", "offline"), 10), sub.messages[-3:]
    sub.close()


def test_a_stop_with_the_broker_down_keeps_the_queue_for_the_next_start(mosquitto, tmp_path):
    sub = mqtt_broker.Subscriber(mosquitto.port, client_id="restart-subscriber")
    mosquitto.stop()
    sink = _sink(mosquitto.port, tmp_path / "spool")
    sink.start()
    for i in range(50):
        sink.publish("door/result", _result(i))
    sink.stop(timeout=2)  # SIGTERM of the service: nothing could be sent
    from toolchain.serve.spool import Spool

    assert len(Spool(tmp_path / "spool")) == 50
    mosquitto.start()
    _next_start_delivers(mosquitto, tmp_path, sub, 51, then=50)


def test_a_stop_with_a_full_queue_sends_what_it_can_and_spools_the_rest_in_order(mosquitto, tmp_path):
    """SIGTERM while 3000 messages wait: the stop sends for 0.3 s, spools the rest; nothing is lost, and the next
    start sends the spool first, so the subscriber holds all of them in order."""
    sub = mqtt_broker.Subscriber(mosquitto.port, client_id="full-queue-subscriber")
    sink = _sink(mosquitto.port, tmp_path / "spool")
    sink.start()
    assert sub.wait_for(lambda m: ("trtc/available", "online") in m, 10)
    for i in range(3000):
        sink.publish("door/result", _result(i))
    sink.stop(timeout=0.3)
    from toolchain.serve.spool import Spool

    waiting = len(Spool(tmp_path / "spool"))
    assert waiting > 0 and sink.counts["spooled"] == waiting, (waiting, sink.counts)
    _next_start_delivers(mosquitto, tmp_path, sub, 3000)


def _next_start_delivers(mosquitto, tmp_path, sub, n: int, then: int | None = None) -> None:
    """A new sink on the same spool (the next start of the service) sends what the spool holds first, then frame
    ``then`` if given: the subscriber ends with frames 0..n-1, in order."""
    again = _sink(mosquitto.port, tmp_path / "spool")
    again.start()
    if then is not None:
        again.publish("door/result", _result(then))
    try:
        assert sub.wait_for(lambda m: len(set(_frames(m))) == n, 60), len(set(_frames(sub.messages)))
        _in_order_without_gap(_frames(sub.messages), n)
    finally:
        again.stop()
        sub.close()


def test_a_killed_process_reads_offline_through_the_brokers_last_will(mosquitto, tmp_path):
    code = f"""
import sys, time
sys.path.insert(0, {os.getcwd()!r})
from toolchain.serve.mqtt import MqttSink
from toolchain.serve.spool import Spool
sink = MqttSink("127.0.0.1", {mosquitto.port}, prefix="trtc", spool=Spool({str(tmp_path / 'spool')!r}))
sink.start()
print("started", flush=True)
time.sleep(60)
"""
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    sub = mqtt_broker.Subscriber(mosquitto.port, topic="trtc/available", client_id="will-subscriber")
    try:
        assert child.stdout.readline().strip() == "started"
        assert sub.wait_for(lambda m: ("trtc/available", "online") in m, 10), sub.messages
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert sub.wait_for(lambda m: m[-1] == ("trtc/available", "offline"), 10), sub.messages
    finally:
        child.kill()
        sub.close()
