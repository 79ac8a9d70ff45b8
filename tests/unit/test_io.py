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
