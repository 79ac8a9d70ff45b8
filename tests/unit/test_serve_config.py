"""The cameras file of `trtc serve` (toolchain.serve.config): checked whole before anything starts, every problem
named with its key path and line, defaults from the top level, and a reload's difference camera by camera."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("yaml")

from toolchain.serve.config import ConfigError, parse_config  # noqa: E402

GOOD = textwrap.dedent("""\
    model: lite0.fp16.onnx
    device: cpu
    stride: 2
    mqtt: {host: 127.0.0.1, port: 1883, topic_prefix: trtc, publish: on_change}
    http: {port: 9108}
    files: {dir: results/, rotate_mb: 100, keep: 10}
    cameras:
      door: {url: "rtsp://cam:s3cret@10.0.0.5/stream1", stride: 5}
      dock:
        url: rtsp://10.0.0.6/main
        top_k: 3
        read_timeout: 5
        model: r50.fp16.onnx
        rotate: 180
      yard: {url: rtsp://10.0.0.7/main, enabled: false, max_lag: 0}
    """)


def test_a_good_file_gives_each_camera_its_keys_over_the_top_level_defaults():
    config = parse_config(GOOD, "cameras.yaml")
    assert config.device == "cpu" and sorted(config.cameras) == ["dock", "door", "yard"]
    door, dock, yard = config.cameras["door"], config.cameras["dock"], config.cameras["yard"]
    assert (door.stride, door.model, door.top_k, door.read_timeout) == (5, "lite0.fp16.onnx", 5, 10.0)
    assert (dock.stride, dock.model, dock.top_k, dock.read_timeout) == (2, "r50.fp16.onnx", 3, 5)
    assert yard.enabled is False and yard.max_lag == 0 and door.enabled is True
    assert (dock.rotate, door.rotate) == (180, "auto")
    assert config.sections["mqtt"] == {"host": "127.0.0.1", "port": 1883, "topic_prefix": "trtc", "publish": "on_change"}
    assert config.sections["files"]["keep"] == 10


def test_every_problem_is_named_with_its_key_and_line_and_a_near_key_is_suggested():
    bad = textwrap.dedent("""\
        model: lite0.onnx
        mqtt: {host: 127.0.0.1, prot: 1883, publish: sometimes}
        cameras:
          door: {url: "rtsp://cam:s3cret@10.0.0.5/1", strde: 5}
          dock: {url: rtsp://10.0.0.6/main, top_k: five, read_timeout: -1, rotate: 45}
          "bad name": {url: rtsp://10.0.0.7/x}
          gate: {stride: 2}
          door2: {url: [1, 2]}
        """)
    with pytest.raises(ConfigError) as err:
        parse_config(bad, "cameras.yaml")
    problems = err.value.problems
    expected = [
        "unknown key mqtt.prot (line 2); did you mean 'port'?",
        "mqtt.publish (line 2) must be one of on_change, every_frame, got 'sometimes'",
        "unknown key cameras.door.strde (line 4); did you mean 'stride'?",
        "cameras.dock.top_k (line 5) must be a whole number of 1 or more, got 'five'",
        "cameras.dock.read_timeout (line 5) must be a positive number of seconds, got -1",
        "cameras.dock.rotate (line 5) must be auto, 0, 90, 180 or 270, got 45",
        "camera name 'bad name' (line 6): use letters, digits, '-' and '_'",
        "cameras.gate (line 7) has no url",
        "cameras.door2.url (line 8) must be a single value, not a list",
    ]
    for want in expected:
        assert any(p.startswith(want) for p in problems), (want, problems)
    assert len(problems) == len(expected), problems
    assert err.value.exit_code == 2 and "s3cret" not in str(err.value)
    assert err.value.reason.startswith("cameras.yaml: 9 problems: ")


def test_repeated_keys_bad_yaml_and_no_cameras_are_refused():
    with pytest.raises(ConfigError, match=r"'door' is given twice \(lines 3 and 4\)"):
        parse_config("model: m.onnx\ncameras:\n  door: {url: rtsp://a/1}\n  door: {url: rtsp://a/2}\n")
    with pytest.raises(ConfigError, match=r"not valid YAML \(line 3\)"):
        parse_config("model: m.onnx\ncameras: {door: [\n")
    with pytest.raises(ConfigError, match="no cameras"):
        parse_config("model: m.onnx\n")
    with pytest.raises(ConfigError, match=r"cameras.door \(line 1\) has no model"):
        parse_config("cameras: {door: {url: rtsp://a/1}}\n")
    with pytest.raises(ConfigError, match=r"the file \(line 1\) must be a mapping"):
        parse_config("- a\n- b\n")


def test_a_reload_is_the_difference_camera_by_camera():
    old = parse_config(GOOD)
    edited = GOOD.replace('stride: 5}', 'stride: 10}').replace("  yard: {url: rtsp://10.0.0.7/main, enabled: false, "
                                                                 "max_lag: 0}\n", "  gate: {url: rtsp://10.0.0.8/g}\n")
    added, removed, changed = parse_config(edited).diff(old)
    assert (added, removed, changed) == (["gate"], ["yard"], ["door"])
    assert parse_config(GOOD).diff(old) == ([], [], [])
    # a top-level default reaches every camera that does not set it: each such camera changes
    assert parse_config(GOOD.replace("stride: 2", "stride: 3")).diff(old) == ([], [], ["dock", "yard"])
