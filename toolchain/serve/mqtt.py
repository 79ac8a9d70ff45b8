"""Results and events to an MQTT broker (paho-mqtt, the serve extra), at QoS 1, without ever slowing the caller
(the queue, sender thread and spool of :class:`toolchain.serve.sink.SpooledSink`).

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
import threading
import time

from engines._deps import require

from .sink import SpooledSink
from .spool import Spool

log = logging.getLogger("trtc")
PURPOSE = "Publishing to MQTT (trtc serve)"
ACK_S = 5.0  # how long a publish may wait for the broker's acknowledgement before it counts as not sent


class MqttSink(SpooledSink):
    name = "mqtt"

    def __init__(self, host: str, port: int = 1883, *, prefix: str = "trtc", spool: Spool, qos: int = 1,
                 queue_size: int = 10000, client_id: str | None = None, username: str | None = None,
                 password: str | None = None, keepalive: int = 10):
        mqtt = require("paho.mqtt.client", PURPOSE, extra="serve", package="paho-mqtt")
        super().__init__(spool, queue_size)
        self.host, self.port, self.prefix, self.qos = host, port, prefix.rstrip("/"), qos
        self.available = f"{self.prefix}/available"
        self._connected = threading.Event()
        self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or "", clean_session=True)
        if username:
            self._client.username_pw_set(username, password)
        self._client.will_set(self.available, "offline", qos=1, retain=True)
        self._client.reconnect_delay_set(min_delay=0.2, max_delay=2)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = lambda *a: self._connected.clear()
        self._keepalive = keepalive

    def _topic(self, topic: str) -> str:
        return f"{self.prefix}/{topic}"

    def _open(self) -> None:
        self._client.connect_async(self.host, self.port, keepalive=self._keepalive)
        self._client.loop_start()

    def _close(self) -> None:
        """Say offline (retained) while still connected, then disconnect."""
        if self._connected.is_set():
            self._client.publish(self.available, "offline", qos=1, retain=True).wait_for_publish(ACK_S)
        self._client.disconnect()
        self._client.loop_stop()

    def _on_connect(self, client, userdata, flags, reason_code, properties=None):
        if reason_code.is_failure:
            log.warning("MQTT broker %s:%s refused the connection: %s", self.host, self.port, reason_code)
            return
        client.publish(self.available, "online", qos=1, retain=True)
        self._connected.set()

    def _ready(self) -> bool:
        return self._connected.is_set()

    def _deliver(self, docs: list[dict]) -> bool:
        """Publish ``docs`` in order and wait for every acknowledgement; False if any was not acknowledged."""
        infos = [self._client.publish(d["topic"], json.dumps(d["payload"]), qos=self.qos) for d in docs]
        deadline = time.monotonic() + ACK_S
        for info in infos:
            try:
                info.wait_for_publish(max(0.0, deadline - time.monotonic()))
            except (RuntimeError, ValueError):  # not queued: the connection went meanwhile
                return False
            if not info.is_published():
                return False
        return True
