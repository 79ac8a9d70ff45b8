"""The sinks a cameras file asks for, opened: MQTT and the webhook (each with its own spool folder), the rotating
files. Relative folders are read from the cameras file's own folder (a service's working directory is often /)."""

from __future__ import annotations

from pathlib import Path

from engines.errors import UsageProblem

from .config import ServeConfig
from .spool import Spool

SPOOL_MB = 512


def beside(config: ServeConfig, path: str) -> Path:
    """``path`` as the cameras file means it: relative to the file's folder."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(config.path).resolve().parent / p


def open_sinks(config: ServeConfig, on_delivered=None, on_spooled=None) -> tuple[list, object]:
    """([started network sinks], RotatingLines or None); ``on_delivered`` / ``on_spooled``: the sinks' hooks
    (:class:`~toolchain.serve.sink.SpooledSink`)."""
    sections = config.sections
    spool = sections.get("spool", {})
    spool_dir = beside(config, spool.get("dir", "spool"))
    max_bytes = int(spool.get("max_mb", SPOOL_MB) * (1 << 20))
    sinks = []
    try:
        if "mqtt" in sections:
            sinks.append(_mqtt(sections["mqtt"], config, Spool(spool_dir / "mqtt", max_bytes)))
        if "webhook" in sections:
            from .webhook import WebhookSink

            hook = sections["webhook"]
            sinks.append(WebhookSink(hook["url"], spool=Spool(spool_dir / "webhook", max_bytes),
                                     batch=hook.get("batch", 50), timeout=hook.get("timeout", 5.0)))
        for sink in sinks:
            sink.on_delivered, sink.on_spooled = on_delivered, on_spooled
            sink.start()
    except BaseException:
        for sink in sinks:
            sink.stop(0)
        raise
    files = None
    if "files" in sections:
        from .files import RotatingLines

        f = sections["files"]
        files = RotatingLines(beside(config, f.get("dir", "results")), int(f.get("rotate_mb", 100) * (1 << 20)),
                              f.get("keep", 10))
    return sinks, files


def _mqtt(section: dict, config: ServeConfig, spool: Spool):
    from .mqtt import MqttSink

    password = None
    if section.get("password_file"):
        path = beside(config, section["password_file"])
        try:
            password = path.read_text().strip()
        except OSError as exc:
            raise UsageProblem(f"mqtt.password_file: cannot read {path}: {exc.strerror or exc}",
                               "give a file holding the broker's password (readable by trtc only)") from exc
    return MqttSink(section.get("host", "127.0.0.1"), section.get("port", 1883),
                    prefix=section.get("topic_prefix", "trtc"), spool=spool, qos=section.get("qos", 1),
                    username=section.get("username"), password=password)
