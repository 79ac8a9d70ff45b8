"""What reading a video file on the CPU path costs, against PyAV's threading modes, measured side by side in one run.

    python examples/bench_cpu_decode.py clip1080.mp4 clip1080_hevc.mp4 --repeat 3 --json-out cpu_decode.json

For each clip: every frame decoded by PyAV with one thread (``NONE``), slice threads (``SLICE``) and frame threads
(``FRAME``), and read by trtc's file reader (``engines.video.sources.PyAVSource``: what `trtc run --device cpu`
decodes, with its damage checks; H.264 and HEVC on one thread, HEVC told to refuse damaged pictures). Frames per
second are the best of ``--repeat`` passes (the decode alone: no preprocessing, no inference); the ratio is against
``SLICE``, PyAV's default. A table is printed last; ``--json-out`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pyav_fps(path: str, thread_type: str) -> tuple[int, float]:
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = thread_type
        t0, n = time.perf_counter(), 0
        for _ in container.decode(stream):
            n += 1
        return n, n / (time.perf_counter() - t0)


def trtc_fps(path: str) -> tuple[int, float]:
    from engines.video.sources import PyAVSource

    src = PyAVSource(path)
    t0, n = time.perf_counter(), 0
    for _ in src.frames():
        n += 1
    return n, n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("clips", nargs="+")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    import av

    rows = []
    for clip in a.clips:
        readers = {mode: (lambda m=mode: pyav_fps(clip, m)) for mode in ("NONE", "SLICE", "FRAME")}
        readers["trtc"] = lambda: trtc_fps(clip)
        best = {name: max((fn() for _ in range(a.repeat)), key=lambda r: r[1]) for name, fn in readers.items()}
        for name, (frames, fps) in best.items():
            rows.append({"clip": os.path.basename(clip), "reader": name, "frames": frames, "fps": round(fps, 1),
                         "vs_slice": round(fps / best["SLICE"][1], 2)})
    print(f"PyAV {av.__version__}, {os.cpu_count()} cores")
    print(f"{'clip':24} {'reader':6} {'frames':>6} {'fps':>7} {'vs SLICE':>8}")
    for r in rows:
        print(f"{r['clip']:24} {r['reader']:6} {r['frames']:6d} {r['fps']:7.1f} {r['vs_slice']:8.2f}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"pyav": av.__version__, "cores": os.cpu_count(), "rows": rows},
                                               indent=1))


if __name__ == "__main__":
    main()
