import pytest

from engines._io import atomic_path, atomic_write_text


def test_atomic_write_replaces(tmp_path):
    target = tmp_path / "a.json"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "m.onnx"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            assert tmp.suffix == ".onnx" and tmp.parent == tmp_path
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_path_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "m.onnx"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"new")
            raise KeyboardInterrupt
    assert target.read_bytes() == b"old" and len(list(tmp_path.iterdir())) == 1


def _artifact_and_manifest(target):
    """What export/quantize/build do: the artifact at a temporary path, its manifest written inside the block."""
    from tests.unit.test_manifest import _manifest
    from engines.manifest import write_manifest

    with atomic_path(target) as tmp:
        tmp.write_bytes(b"the artifact")
        write_manifest(target, _manifest(), hashed_as=tmp)


def test_the_artifact_is_placed_before_its_manifest_and_everything_is_fsynced(tmp_path, monkeypatch):
    """Issue 16 item 15: the manifest used to be moved into place before the artifact, and nothing was fsynced."""
    import os

    import engines._io as io_mod

    events = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(src, dst):
        events.append(("replace", os.path.basename(dst)))
        real_replace(src, dst)

    def fsync(fd):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    monkeypatch.setattr(io_mod.os, "replace", replace)
    monkeypatch.setattr(io_mod.os, "fsync", fsync)
    _artifact_and_manifest(tmp_path / "m.plan")
    replaced = [e[1] for e in events if e[0] == "replace"]
    assert replaced == ["m.plan", "m.plan.json"]  # artifact first, then its manifest
    synced = [e[1] for e in events if e[0] == "fsync"]
    assert any(s.startswith(".m.plan.json.") for s in synced) and any(s.startswith(".m.plan.") and
                                                                      ".json" not in s for s in synced)
    assert events[-1] == ("fsync", tmp_path.name)  # then the folder, after both renames
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.plan", "m.plan.json"]
    from engines.manifest import read_manifest

    assert read_manifest(tmp_path / "m.plan").artifact["bytes"] == len(b"the artifact")


def test_an_interrupt_while_placing_the_artifact_leaves_no_manifest(tmp_path, monkeypatch):
    import os

    import engines._io as io_mod

    real_replace = os.replace

    def replace(src, dst):
        if str(dst).endswith("m.plan"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(io_mod.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        _artifact_and_manifest(tmp_path / "m.plan")
    assert list(tmp_path.iterdir()) == []  # no manifest without its artifact, no temporaries
