"""Does a PyNvVideoCodec decoder crash the process? Run this in a loop of fresh processes before trusting one.

    for i in 1 2 3 4 5 6; do python examples/nvdec_stress.py clip1080.mp4 threaded; echo "rc=$?"; done

Each process decodes the clip ROUNDS times at 1, 8 and 16 streams at once (a thread per stream, frames dropped)
with one of PyNvVideoCodec's decoders and prints a line per completed run. A crash in a decoder's native thread
kills the process with no Python error: rc 139 (segfault) or 134 (abort), and fewer lines than expected.

Decoders: ``threaded`` (ThreadedDecoder), ``threaded-lock`` (ThreadedDecoder, created and ended under one lock),
``simple`` (SimpleDecoder, kept from run to run and pointed at the clip again with ``reconfigure_decoder``, as
trtc does for files) and ``core`` (demuxer + core decoder packet loop, what trtc uses for live and low-latency
sources). On an H200 with PyNvVideoCodec 2.2.4 the ThreadedDecoder crashed 3 of 6 processes (1 of 6 with the
lock); the SimpleDecoder (8 processes, new decoders each run) and the core loop (6) never did
(docs/BENCHMARKS.md). Needs a GPU, CuPy and PyNvVideoCodec.
"""

from __future__ import annotations

import argparse
import threading

LOCK = threading.Lock()


def decode_threaded(nvc, cp, video: str, with_lock: bool) -> int:
    """Decode the whole clip once with a ThreadedDecoder on a stream of this thread's own; returns the frames."""
    stream = cp.cuda.Stream(non_blocking=True)

    def make():
        return nvc.ThreadedDecoder(video, buffer_size=32, gpu_id=0, cuda_context=0, cuda_stream=stream.ptr,
                                   use_device_memory=True)

    if with_lock:
        with LOCK:
            dec = make()
    else:
        dec = make()
    n = 0
    while True:
        frames = dec.get_batch_frames(16)
        if not frames:
            break
        n += len(frames)
        del frames
    stream.synchronize()
    if with_lock:
        with LOCK:
            dec.end()
            del dec
    else:
        dec.end()
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("video")
    ap.add_argument("decoder", choices=["threaded", "threaded-lock", "simple", "core"])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import cupy as cp
    import PyNvVideoCodec as nvc

    # the core loop and the SimpleDecoder are the bench's own decode-only pipelines
    from toolchain.bench_video import _decode_only, _decode_only_batched, _each_stream_timed

    def run(streams: int) -> tuple[int, float]:
        if args.decoder == "core":
            return _decode_only(args.video, streams, 0)
        if args.decoder == "simple":
            return _decode_only_batched(args.video, streams, 0)

        def work(_i):
            with cp.cuda.Device(0):
                return decode_threaded(nvc, cp, args.video, args.decoder == "threaded-lock")

        return _each_stream_timed(streams, work)

    for r in range(args.rounds):
        for streams in (1, 8, 16):
            frames, seconds = run(streams)
            print(f"ok {args.decoder} round={r} streams={streams} frames={frames} fps={frames / seconds:.0f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
