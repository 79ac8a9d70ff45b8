"""The service's JSON-lines files (toolchain.serve.files): each line is in the file whole as soon as it is written
(what `tail -F` follows), rotations lose and split none, and rotation keeps the last ``keep`` files."""

from __future__ import annotations

import json

from toolchain.serve.files import RotatingLines


def _line(i: int) -> str:
    return json.dumps({"camera": "door", "frame": i, "top_k": [{"label": "unicycle", "score": 0.5}], "pad": "x" * 60})


def test_each_line_is_in_the_file_whole_as_soon_as_it_is_written_and_rotations_lose_none(tmp_path):
    """After each write() a new reader of the name finds that line whole at the file's end (flushed, not held in a
    buffer: what `tail -F` shows), and the rotated files and the current one hold every line once, in order."""
    files = RotatingLines(tmp_path, rotate_bytes=20_000, keep=100)
    path = files.path("door")
    for i in range(2000):  # about 230 kB: a dozen rotations
        files.write("door", _line(i))
        with open(path, "rb") as reader:
            data = reader.read()
        assert data.endswith(b"\n") and json.loads(data.splitlines()[-1])["frame"] == i
    files.close()
    rotated = sorted(tmp_path.glob("door.jsonl.*"), key=lambda p: -int(p.suffix[1:]))
    assert len(rotated) >= 10
    frames = [json.loads(line)["frame"] for p in [*rotated, path] for line in p.read_text().splitlines()]
    assert frames == list(range(2000))


def test_rotation_keeps_the_last_files_and_never_splits_a_line(tmp_path):
    files = RotatingLines(tmp_path, rotate_bytes=1000, keep=3)
    for i in range(100):
        files.write("dock", _line(i))
    files.close("dock")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["dock.jsonl", "dock.jsonl.1", "dock.jsonl.2", "dock.jsonl.3"]
    frames = []
    for name in ["dock.jsonl.3", "dock.jsonl.2", "dock.jsonl.1", "dock.jsonl"]:
        lines = (tmp_path / name).read_text().splitlines()
        assert (tmp_path / name).stat().st_size <= 1000 or len(lines) == 1  # rotated before passing the size
        frames += [json.loads(line)["frame"] for line in lines]
    assert frames == list(range(frames[0], 100))  # the newest, in order, with no gap
    files.write("dock", _line(100))  # a camera added again: appends
    assert json.loads((tmp_path / "dock.jsonl").read_text().splitlines()[-1])["frame"] == 100
