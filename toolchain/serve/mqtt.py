"""Results and events to an MQTT broker (paho-mqtt, the serve extra), at QoS 1, without ever slowing the caller.

    sink = MqttSink("127.0.0.1", 1883, prefix="trtc", spool=Spool("spool/mqtt"))
    sink.start()                                   # connects in the background; retries for as long as it runs
    sink.publish("door/result", {"camera": "door", "frame": 7, ...})   # never blocks: queued, or spooled
    sink.stop()                                    # the queue to the broker, or to the spool; "offline"

Topics: ``{prefix}/{camera}/result``, ``{prefix}/{camera}/event`` (the caller names the part after the prefix) and
``{prefix}/available``: ``online`` (retained) while connected, and ``offline`` (retained), also as the broker's last
will, so that a killed process reads offline. One sender thread owns the connection, the queue's far end and the
spool's reading side: a message goes to the broker when it is connected and the spool is empty, else to the spool,
which the sender drains, oldest first, once the broker is back, before anything newer: messages reach the broker in
the order they were published. A message counts as sent when the broker acknowledged it (PUBACK); one that was not
is spooled again, so the guarantee is at-least-once within the spool's bound (each message carries camera, frame
and a wall time, for a consumer to drop duplicates).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time

from engines._deps import require

from .spool import Spool

log = logging.getLogger("trtc")
PURPOSE = "Publishing to MQTT (trtc serve)"
ACK_S = 5.0  # how long a publish may wait for the broker's acknowledgement before it counts as not sent


class MqttSink:
    def __init__(self, host: str, port: int = 1883, *, prefix: str = "trtc", spool: Spool, qos: int = 1,
                 queue_size: int = 10000, client_id: str | None = None, username: str | None = None,
                 password: str | None = None, keepalive: int = 10):
        mqtt = require("paho.mqtt.client", PURPOSE, extra="serve", package="paho-mqtt")
        self.host, self.port, self.prefix, self.qos, self.spool = host, port, prefix.rstrip("/"), qos, spool
        self.available = f"{self.prefix}/available"
        self.counts = {"published": 0, "spooled": 0, "sent_from_spool": 0, "queue_full": 0}  # under _count_lock
        self._count_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(queue_size)
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or "", clean_session=True)
        if username:
            self._client.username_pw_set(username, password)
        self._client.will_set(self.available, "offline", qos=1, retain=True)
        self._client.reconnect_delay_set(min_delay=0.2, max_delay=2)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = lambda *a: self._connected.clear()
        self._keepalive = keepalive
        self._deadline = float("inf")  # set by stop(): until when the queue may still go to the broker
        self._thread = threading.Thread(target=self._send, name="trtc-mqtt", daemon=True)

    def start(self) -> None:
        self._client.connect_async(self.host, self.port, keepalive=self._keepalive)
        self._client.loop_start()
        self._thread.start()

    def publish(self, topic: str, message: dict) -> None:
        """Queue ``message`` for ``{prefix}/{topic}``; never blocks (a full queue goes to the spool)."""
        record = json.dumps({"topic": f"{self.prefix}/{topic}", "payload": message}, separators=(",", ":"))
        try:
            self._queue.put_nowait(record)
        except queue.Full:  # the sender is behind (a slow broker): straight to disk, in order behind what it holds
            self._count("queue_full")
            self.spool.put(record.encode())

    def stop(self, timeout: float = 10.0) -> None:
        """Send what is queued for up to ``timeout`` s (to the broker while it takes it, the rest to the spool, in
        order), say offline, disconnect."""
        self._deadline = time.monotonic() + timeout
        self._stop.set()
        self._thread.join(timeout + ACK_S + 5)
        if self._connected.is_set():
            self._client.publish(self.available, "offline", qos=1, retain=True).wait_for_publish(ACK_S)
        self._client.disconnect()
        self._client.loop_stop()

    # the sender thread -----------------------------------------------------------------------------------------
    def _on_connect(self, client, userdata, flags, reason_code, properties=None):
        if reason_code.is_failure:
            log.warning("MQTT broker %s:%s refused the connection: %s", self.host, self.port, reason_code)
            return
        client.publish(self.available, "online", qos=1, retain=True)
        self._connected.set()

    def _send(self) -> None:
        while True:
            if self._stop.is_set() and (not self._connected.is_set() or time.monotonic() > self._deadline):
                while True:  # stopping, and the broker takes no more now: the rest to the spool, in order
                    try:
                        self._spool(self._queue.get_nowait())
                    except queue.Empty:
                        return
            if self._connected.is_set() and self._drain_spool():
                continue  # more to drain
            try:
                record = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            # behind what the spool holds, or with no broker: spooled, so that the order holds
            if not self._connected.is_set() or not self.spool.empty() or not self._deliver([record]):
                self._spool(record)
            else:
                self._count("published")

    def _count(self, key: str, n: int = 1) -> None:
        with self._count_lock:
            self.counts[key] += n

    def _spool(self, record: str) -> None:
        self.spool.put(record.encode())
        self._count("spooled")

    def _drain_spool(self, batch: int = 200) -> bool:
        """Send the spool's oldest ``batch`` records; True when some went and more may wait."""
        records = self.spool.peek(batch)
        if not records:
            return False
        if not self._deliver([r.decode() for r in records]):
            time.sleep(0.2)
            return False
        self.spool.ack(len(records))
        self._count("sent_from_spool", len(records))
        return True

    def _deliver(self, records: list[str]) -> bool:
        """Publish ``records`` in order and wait for every acknowledgement; False if any was not acknowledged."""
        infos = []
        for record in records:
            doc = json.loads(record)
            infos.append(self._client.publish(doc["topic"], json.dumps(doc["payload"]), qos=self.qos))
        deadline = time.monotonic() + ACK_S
        for info in infos:
            try:
                info.wait_for_publish(max(0.0, deadline - time.monotonic()))
            except (RuntimeError, ValueError):  # not queued: the connection went meanwhile
                return False
            if not info.is_published():
                return False
        return True
