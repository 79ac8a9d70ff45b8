"""An app that owns its capture and pushes frames into trtc (engines.video.FramePusher): one capture thread per
camera or file, decoded by PyAV (any FFmpeg input: a file, rtsp://, /dev/video0 with --format v4l2), alerts on
watched classes from the result callback.

    python3 examples/push_frames.py lite0.onnx bikes.mp4 --device cpu --watch "mountain bike"
    python3 examples/push_frames.py resnet50.fp16.onnx rtsp://cam1/stream rtsp://cam2/stream --device cuda:0 --gpu-frames

``--gpu-frames`` uploads each frame with CuPy first, as a capture that delivers device memory would hand it over
(then trtc reads it in place on the GPU); without it NumPy frames are pushed (on a GPU engine, uploaded by trtc).
"""

from __future__ import annotations

import argparse
import threading


def capture(pusher, source: str, fmt: str | None, gpu_frames: bool, stop: threading.Event) -> None:
    """Decode ``source`` with PyAV and push every frame as NV12 with its own timestamp and number."""
    import av

    with av.open(source, format=fmt) as container:
        stream = container.streams.video[0]
        base = float(stream.time_base or 0)
        for n, frame in enumerate(container.decode(stream)):
            if stop.is_set():
                return
            nv12 = frame.to_ndarray(format="nv12")
            if gpu_frames:
                import cupy as cp

                nv12 = cp.asarray(nv12)
            pusher.push(source, nv12, pts=frame.pts, time=frame.pts * base if frame.pts is not None else None,
                        frame_id=n, format="NV12")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--format", help="FFmpeg input format, e.g. v4l2 for /dev/video0")
    ap.add_argument("--gpu-frames", action="store_true")
    ap.add_argument("--on-lag", default="block", choices=["block", "drop-oldest"])
    ap.add_argument("--watch", action="append", default=[], help="a class label to alert on")
    args = ap.parse_args()

    import engines
    from engines.video import FramePusher

    seen = {"frames": 0, "alerts": 0}

    def on_prediction(pred):  # called in trtc's result thread, each source's frames in order
        seen["frames"] += 1
        if pred.labels and pred.labels[0] in args.watch:
            seen["alerts"] += 1
            print(f"ALERT {pred.source} frame {pred.frame} t={pred.time:.2f}s: {pred.labels[0]} "
                  f"({pred.scores[0]:.2f})", flush=True)

    stop = threading.Event()
    with engines.open_engine(args.model, device=args.device) as engine, \
            FramePusher(engine, batch=args.batch, top_k=1, on_lag=args.on_lag, callback=on_prediction) as pusher:
        threads = [threading.Thread(target=capture, args=(pusher, s, args.format, args.gpu_frames, stop), daemon=True)
                   for s in args.sources]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        except KeyboardInterrupt:
            stop.set()
    stats = pusher.stats
    print(f"{stats.frames} frames classified in {stats.seconds:.2f} s ({stats.fps:.1f} fps), "
          f"{sum(stats.dropped.values())} dropped, {seen['alerts']} alert(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
