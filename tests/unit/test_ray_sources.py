"""`trtc run --ray`'s inputs, without starting Ray: what --ray takes as an address, how folders and @lists expand,
and the one-line errors for a batch without --ray and for Ray options without --ray."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from engines.errors import UsageProblem
from toolchain.cli import cli
from toolchain.run import _no_batch, batch_sources, is_ray_address


def test_ray_addresses_and_sources_are_told_apart():
    for a in ("local", "auto", "10.0.0.5:6379", "head-node.lan:6379", "ray://head:10001", "[fd00::5]:6379"):
        assert is_ray_address(a), a
    from engines.video.ray_cluster import _host_port

    assert _host_port("10.0.0.5:6379") == ("10.0.0.5", 6379) and _host_port("ray://head:10001") == ("head", 10001)
    assert _host_port("[fd00::5]:6379") == ("fd00::5", 6379) and _host_port("head") is None
    for s in ("clip.mp4", "/data/archive", "@list.txt", "rtsp://cam/live", "archive/", "auto.mp4"):
        assert not is_ray_address(s), s


def test_folders_and_lists_expand(tmp_path):
    (tmp_path / "a" / "deep").mkdir(parents=True)
    for name in ("a/x.mp4", "a/deep/y.MKV", "a/notes.txt", "a/z.ts"):
        (tmp_path / name).write_bytes(b"")
    folder = str(tmp_path / "a")
    assert batch_sources([folder]) == sorted([f"{folder}/deep/y.MKV", f"{folder}/x.mp4", f"{folder}/z.ts"])
    listing = tmp_path / "list.txt"
    listing.write_text("# cameras\nrel.mp4\n\n/abs/b.mp4\n  rtsp://cam7/live  \n")
    assert batch_sources([f"@{listing}", "c.mp4"]) == [str(tmp_path / "rel.mp4"), "/abs/b.mp4", "rtsp://cam7/live",
                                                       "c.mp4"]
    with pytest.raises(UsageProblem, match="listed twice"):
        batch_sources(["c.mp4", f"@{listing}", "c.mp4"])
    with pytest.raises(UsageProblem, match="not found"):
        batch_sources([f"@{tmp_path / 'nope.txt'}"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageProblem, match="holds no video"):
        batch_sources([str(tmp_path / "empty")])
    with pytest.raises(UsageProblem, match="--ray") as e:
        _no_batch([folder], "lite0.onnx")
    assert "--ray" in e.value.fix


def test_cli_refuses_ray_options_without_ray_and_device_lists_with_it(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    r = CliRunner().invoke(cli, ["run", "clip.mp4", "--model", str(model), "--ray-actors", "2"])
    assert r.exit_code == 2 and "go with --ray" in r.output
    r = CliRunner().invoke(cli, ["run", "--model", str(model)])
    assert r.exit_code == 2 and "no video sources" in r.output
    r = CliRunner().invoke(cli, ["run", str(tmp_path), "--model", str(model)])
    assert r.exit_code == 2 and "a folder with no video or image in it" in r.output
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / "a.mp4").write_bytes(b"")
    r = CliRunner().invoke(cli, ["run", str(tmp_path / "videos"), "--model", str(model)])
    assert r.exit_code == 2 and "a folder of videos" in r.output and "with --ray" in r.output


def test_ray_device_choices():
    from engines.video.ray_cluster import _absolute, _kind

    assert [_kind(d) for d in ("auto", "cpu", "cuda", "cuda:all", "gpu")] == ["auto", "cpu", "gpu", "gpu", "gpu"]
    with pytest.raises(UsageProblem, match="Ray gives each actor its GPU"):
        _kind("cuda:0,cuda:1")
    assert _absolute("rtsp://cam/live") == "rtsp://cam/live" and _absolute("/a/b.mp4") == "/a/b.mp4"
    assert _absolute("b.mp4").startswith("/")
