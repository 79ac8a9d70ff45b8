"""The cameras file of `trtc serve`: read, checked as a whole before anything starts, and compared with the running
one on a reload.

    config = load_config("cameras.yaml")      # ConfigError (exit 2) listing every problem, with its key and line
    added, removed, changed = config.diff(old)

```yaml
model: lite0.fp16.onnx          # the default model; a camera may name its own
device: cuda:0                  # or cpu, or auto
stride: 1                       # any per-camera key here is the default of every camera
mqtt: {host: 127.0.0.1, port: 1883, topic_prefix: trtc, publish: on_change}   # or every_frame
http: {port: 9108}              # host: 127.0.0.1 unless set
files: {dir: results/, rotate_mb: 100, keep: 10}
webhook: {url: "http://127.0.0.1:8080/trtc", batch: 50}
spool: {dir: spool/, max_mb: 512}
events: {hold: 3, min_score: 0.4}
cameras:
  door: {url: "rtsp://10.0.0.5/stream1", stride: 5}
  dock: {url: "rtsp://10.0.0.6/main", top_k: 3, read_timeout: 5, rotate: 180}   # mounted upside down
```

Every key means what `trtc run`'s option of the same name does (with ``-`` as ``_``). An unknown key is refused
with the nearest known one ("did you mean"); a value of the wrong type names its key path and line. A camera URL is
never repeated in a message: it may hold a password.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from engines._deps import require
from engines.errors import UsageProblem

PURPOSE = "Reading a trtc serve cameras file"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")  # a camera's name: an MQTT topic level, a metrics label


class ConfigError(UsageProblem):
    """The cameras file cannot be used: ``problems`` lists each (key path, line, what is wrong)."""

    def __init__(self, path, problems: list[str]):
        self.problems = problems
        head = f"{path}: {len(problems)} problem{'s' if len(problems) > 1 else ''}: " if len(problems) > 1 else f"{path}: "
        super().__init__(head + "; ".join(problems), "correct the file and start again (the running cameras are kept "
                                                     "on a reload)")


# value checks: (what the value must be, check) -------------------------------------------------------------------
def _positive_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _seconds(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _seconds_or_zero(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _text(v):
    return isinstance(v, str) and v.strip() != ""


def _port(v):
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65535


def _fraction(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1


def _choice(*options):
    return (f"one of {', '.join(options)}", lambda v: v in options)


KINDS = {
    "int": ("a whole number of 1 or more", _positive_int),
    "seconds": ("a positive number of seconds", _seconds),
    "seconds0": ("0 or more seconds", _seconds_or_zero),
    "text": ("a non-empty text", _text),
    "port": ("a port number (1-65535)", _port),
    "fraction": ("a number from 0 to 1", _fraction),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "on_lag": _choice("drop-oldest", "block"),
    "transport": _choice("tcp", "udp"),
    "publish": _choice("on_change", "every_frame"),
    "rotate": ("auto, 0, 90, 180 or 270", lambda v: str(v).strip().lower() in ("auto", "0", "90", "180", "270")
               and not isinstance(v, (bool, float))),
}
# the per-camera keys (also allowed at the top level as every camera's default), and their kinds
CAMERA_KEYS = {"model": "text", "stride": "int", "top_k": "int", "read_timeout": "seconds", "open_timeout": "seconds",
               "reconnect_for": "seconds0", "max_lag": "seconds0", "on_lag": "on_lag", "rtsp_transport": "transport",
               "hold": "int", "min_score": "fraction", "rotate": "rotate"}
SECTIONS = {
    "mqtt": {"host": "text", "port": "port", "topic_prefix": "text", "publish": "publish", "username": "text",
             "password_file": "text", "qos": "int"},
    "http": {"host": "text", "port": "port"},
    "files": {"dir": "text", "rotate_mb": "seconds", "keep": "int"},
    "webhook": {"url": "text", "batch": "int", "timeout": "seconds"},
    "spool": {"dir": "text", "max_mb": "seconds"},
    "events": {"hold": "int", "min_score": "fraction"},
}
TOP_KEYS = {"device": "text", **CAMERA_KEYS}


@dataclass(frozen=True)
class Camera:
    """One camera as it will run: its own keys over the file's top-level defaults over trtc run's defaults."""

    name: str
    url: str
    model: str
    enabled: bool = True
    stride: int = 1
    top_k: int = 5
    read_timeout: float = 10.0
    open_timeout: float = 10.0
    reconnect_for: float = 300.0
    max_lag: float = 2.0
    on_lag: str = "drop-oldest"
    rtsp_transport: str = "tcp"
    hold: int = 3
    min_score: float = 0.4
    rotate: str | int = "auto"  # "auto": each connection's display matrix; 0/90/180/270: clockwise, instead of it


@dataclass
class ServeConfig:
    path: str
    device: str = "auto"
    cameras: dict[str, Camera] = field(default_factory=dict)
    sections: dict[str, dict] = field(default_factory=dict)  # mqtt, http, files, webhook, spool, events as given

    def diff(self, old: "ServeConfig") -> tuple[list[str], list[str], list[str]]:
        """(added, removed, changed) camera names against ``old``, each sorted: what a reload starts, stops and
        restarts; every other camera runs on untouched."""
        added = sorted(set(self.cameras) - set(old.cameras))
        removed = sorted(set(old.cameras) - set(self.cameras))
        changed = sorted(n for n in set(self.cameras) & set(old.cameras) if self.cameras[n] != old.cameras[n])
        return added, removed, changed


def load_config(path: str | Path) -> ServeConfig:
    """The cameras file at ``path``, checked whole: :class:`ConfigError` lists every problem found."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageProblem(f"cannot read the cameras file {path}: {exc}", "give the path of a YAML file") from exc
    return parse_config(text, str(path))


def parse_config(text: str, where: str = "<config>") -> ServeConfig:
    """:func:`load_config` of a file's text (``where`` names it in messages)."""
    yaml = require("yaml", PURPOSE, extra="serve", package="pyyaml")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(where, [f"not valid YAML{line}: {getattr(exc, 'problem', None) or exc}"]) from exc
    problems: list[str] = []
    top = _mapping(root, "the file", problems, yaml) if root is not None else {}
    config = ServeConfig(where)
    _check_keys(top, {*TOP_KEYS, *SECTIONS, "cameras"}, "", problems)
    defaults = {k: _value(top[k], k, TOP_KEYS[k], problems, yaml) for k in top if k in TOP_KEYS}
    config.device = defaults.pop("device", "auto")
    for name in SECTIONS:
        if name in top:
            section = _mapping(top[name][1], name, problems, yaml)
            _check_keys(section, set(SECTIONS[name]), f"{name}.", problems)
            config.sections[name] = {k: _value(section[k], f"{name}.{k}", SECTIONS[name][k], problems, yaml)
                                     for k in section if k in SECTIONS[name]}
    if "cameras" not in top:
        problems.append("no cameras: add a 'cameras:' mapping of name -> {url: ...}")
    else:
        cameras = _mapping(top["cameras"][1], "cameras", problems, yaml)
        if not cameras and not problems:
            problems.append(f"'cameras' is empty (line {top['cameras'][1].start_mark.line + 1}): name at least one")
        for name, (key_node, node) in cameras.items():
            camera = _camera(name, key_node, node, defaults, problems, yaml)
            if camera is not None:
                config.cameras[name] = camera
    if problems:
        raise ConfigError(where, problems)
    return config


def _camera(name, key_node, node, defaults: dict, problems: list, yaml) -> Camera | None:
    line = key_node.start_mark.line + 1
    if not NAME.match(name):
        problems.append(f"camera name {name!r} (line {line}): use letters, digits, '-' and '_' (it becomes an MQTT "
                        "topic level and a metrics label)")
        return None
    given = _mapping(node, f"cameras.{name}", problems, yaml)
    _check_keys(given, {*CAMERA_KEYS, "url", "enabled"}, f"cameras.{name}.", problems)
    values = dict(defaults)
    for key in given:
        if key == "url":
            values["url"] = _value(given[key], f"cameras.{name}.url", "text", problems, yaml, secret=True)
        elif key == "enabled":
            values["enabled"] = _value(given[key], f"cameras.{name}.enabled", "bool", problems, yaml)
        elif key in CAMERA_KEYS:
            values[key] = _value(given[key], f"cameras.{name}.{key}", CAMERA_KEYS[key], problems, yaml)
    for needed in ("url", "model"):
        if needed not in given and needed not in defaults:
            where = "" if needed == "url" else " (or a top-level 'model:' for every camera)"
            problems.append(f"cameras.{name} (line {line}) has no {needed}{where}")
    if any(values.get(k) is None for k in values) or values.get("url") is None or values.get("model") is None:
        return None
    return Camera(name=name, **{f.name: values[f.name] for f in fields(Camera) if f.name in values})


def _mapping(node, what: str, problems: list, yaml) -> dict:
    """``node``'s keys -> (key node, value node); a problem (and {}) when it is no mapping or repeats a key."""
    if not isinstance(node, yaml.MappingNode):
        problems.append(f"{what} (line {node.start_mark.line + 1}) must be a mapping of key: value")
        return {}
    out: dict = {}
    for key_node, value_node in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if key is None:
            problems.append(f"{what}: a key that is not a name (line {key_node.start_mark.line + 1})")
        elif key in out:
            problems.append(f"{what}: {key!r} is given twice (lines {out[key][0].start_mark.line + 1} and "
                            f"{key_node.start_mark.line + 1})")
        else:
            out[key] = (key_node, value_node)
    return out


def _check_keys(given: dict, known: set, prefix: str, problems: list) -> None:
    for key, (key_node, _) in given.items():
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else f"; known here: {', '.join(sorted(known))}"
            problems.append(f"unknown key {prefix}{key} (line {key_node.start_mark.line + 1}){hint}")


def _value(entry, path: str, kind: str, problems: list, yaml, secret: bool = False):
    """The Python value of ``entry`` (key node, value node), or None with a problem when it is not ``kind``."""
    _, node = entry
    line = node.start_mark.line + 1
    if not isinstance(node, yaml.ScalarNode):
        problems.append(f"{path} (line {line}) must be a single value, not a {'list' if isinstance(node, yaml.SequenceNode) else 'mapping'}")
        return None
    value = yaml.safe_load(yaml.serialize(node))
    what, ok = KINDS[kind]
    if not ok(value):
        shown = "" if secret else f", got {value!r}"
        problems.append(f"{path} (line {line}) must be {what}{shown}")
        return None
    return value
