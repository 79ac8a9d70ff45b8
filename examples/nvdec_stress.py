"""Does a PyNvVideoCodec decoder crash the process? Run this in a loop of fresh processes before trusting one.

    for i in 1 2 3 4 5 6; do python examples/nvdec_stress.py clip1080.mp4 threaded; echo "rc=$?"; done

Each process decodes the clip ROUNDS times at 1, 8 and 16 streams at once (a thread per stream, frames dropped)
with one of PyNvVideoCodec's decoders and prints a line per completed run. A crash in a decoder's native thread
kills the process with no Python error: rc 139 (segfault) or 134 (abort), and fewer lines than expected.

Decoders: ``threaded`` (ThreadedDecoder), ``threaded-lock`` (ThreadedDecoder, created and ended under one lock),
``simple`` (SimpleDecoder, what trtc uses for files) and ``core`` (demuxer + core decoder packet loop, what trtc
uses for live and low-latency sources). On an H200 with PyNvVideoCodec 2.2.4 the ThreadedDecoder crashed 3 of 6
processes (1 of 6 with the lock); the SimpleDecoder (8 processes) and the core loop (6) never did
(docs/BENCHMARKS.md). Needs a GPU, CuPy and PyNvVideoCodec.
"""

from __future__ import annotations

import argparse
import threading
import time

LOCK = threading.Lock()


def decode(nvc, cp, video: str, kind: str) -> int:
    """Decode the whole clip once on a stream of this thread's own; returns the frames decoded."""
    stream = cp.cuda.Stream(non_blocking=True)
    n = 0
    if kind == "core":
        dmx = nvc.CreateDemuxer(filename=video)
        dec = nvc.CreateDecoder(gpuid=0, codec=dmx.GetNvCodecId(), cudacontext=0, cudastream=stream.ptr,
                                usedevicememory=True)
        for packet in dmx:
            n += len(dec.Decode(packet))
        stream.synchronize()
        return n
    if kind == "simple":
        dec = nvc.SimpleDecoder(video, gpu_id=0, cuda_context=0, cuda_stream=stream.ptr, use_device_memory=True)
        total = len(dec)
        while n < total:
            frames = dec.get_batch_frames(min(16, total - n))
            if not frames:
                break
            n += len(frames)
            del frames
        stream.synchronize()
        return n

    def make():
        return nvc.ThreadedDecoder(video, buffer_size=32, gpu_id=0, cuda_context=0, cuda_stream=stream.ptr,
                                   use_device_memory=True)

    if kind == "threaded-lock":
        with LOCK:
            dec = make()
    else:
        dec = make()
    while True:
        frames = dec.get_batch_frames(16)
        if not frames:
            break
        n += len(frames)
        del frames
    stream.synchronize()
    if kind == "threaded-lock":
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

    for r in range(args.rounds):
        for streams in (1, 8, 16):
            counts = [0] * streams

            def work(i):
                with cp.cuda.Device(0):
                    counts[i] = decode(nvc, cp, args.video, args.decoder)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(streams)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            fps = sum(counts) / (time.perf_counter() - t0)
            print(f"ok {args.decoder} round={r} streams={streams} frames={sum(counts)} fps={fps:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
