"""NVDEC decoders kept between sources: the decoder-reuse stage of the GPU video runtime.

Opening an NVDEC decoder is slow and does not run in parallel: on the H200, the 16 SimpleDecoders of 16 sources
gave their first frames after 639 ms (median) and 1010 ms (last), one after another, and a process that freed 16
decoders and made 16 new ones waited longer still. ``SimpleDecoder.reconfigure_decoder(file)`` points a decoder
that exists at the next file instead: the 16 first frames came after 34 / 57 ms, and a 600-frame 1080p clip on 16
streams went from 3788 to 4658 fps (examples/nvdec_open_cost.py; docs/BENCHMARKS.md). So a source that ends
cleanly gives its decoder back here, and the next source of the same format on the same GPU takes it: the next
:func:`engines.video.classify` call, the next loop of a looped source, the next job of a worker process or Ray
actor.

An entry is a decoder with the CUDA stream it was made on (the decoder writes its frames on that stream, and
the pipeline's kernels read them in order on it). It is keyed by GPU and format (codec, chroma, bit depth,
width x height): a decoder is only ever pointed at a file of exactly its own format, so no reconfiguration can
fail for a size or format it was not made for. A decoder that saw an error, or stopped mid-file, is never kept.

Idle decoders hold their GPU surface pools (about 119 MiB each for 1080p H.264 on the H200): at most
:data:`DEFAULT_LIMIT` are kept per process, or the number in the environment variable ``TRTC_KEEP_DECODERS``
(0 keeps none: every source opens its own decoder, as before reuse). :func:`release_decoders` frees them (all,
or one GPU's), and they are freed when the process exits.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

log = logging.getLogger("trtc")

DEFAULT_LIMIT = 64  # idle decoders kept per process (32 streams on two pipelines' worth)


def _limit_from_env() -> int:
    text = os.environ.get("TRTC_KEEP_DECODERS", "").strip()
    if not text:
        return DEFAULT_LIMIT
    try:
        return max(0, int(text))
    except ValueError:
        log.warning("TRTC_KEEP_DECODERS=%r is not a number; keeping up to %d decoders", text, DEFAULT_LIMIT)
        return DEFAULT_LIMIT


class DecoderCache:
    """Idle (stream, decoder) pairs by (gpu, format)."""

    def __init__(self, limit: int | None = None):
        self.limit = _limit_from_env() if limit is None else limit
        self._idle: dict[tuple, list[tuple]] = {}
        self._lock = threading.Lock()
        self.reused = 0  # decoders handed out again (for tests and stats)

    def take(self, gpu: int, fmt: str):
        """(stream, decoder) of an idle decoder made for ``fmt`` on ``gpu``, or (None, None)."""
        with self._lock:
            entries = self._idle.get((gpu, fmt))
            if entries:
                self.reused += 1
                return entries.pop()
        return None, None

    def give(self, gpu: int, fmt: str, stream, decoder) -> None:
        """Keep ``decoder`` (made on ``stream``) for the next source of ``fmt`` on ``gpu``: call it only after the
        stream's work is finished and only for a decoder that decoded its file to the end without an error."""
        with self._lock:
            if self.idle() < self.limit:
                self._idle.setdefault((gpu, fmt), []).append((stream, decoder))
                return
        # over the limit: not kept; the decoder is freed when the caller lets go of it

    def idle(self, gpu: int | None = None) -> int:
        return sum(len(v) for (g, _f), v in list(self._idle.items()) if gpu is None or g == gpu)

    def release(self, gpu: int | None = None) -> int:
        """Free the idle decoders (of ``gpu``, or all); returns how many."""
        with self._lock:
            keys = [k for k in self._idle if gpu is None or k[0] == gpu]
            dropped = [self._idle.pop(k) for k in keys]
        n = sum(len(v) for v in dropped)
        dropped.clear()  # the decoders go here, outside the lock
        return n


DECODERS = DecoderCache()


def release_decoders(gpu: int | None = None) -> int:
    """Free the NVDEC decoders this process keeps for reuse (those of GPU ``gpu``, or all): their GPU memory goes
    back. The next source then opens a new decoder. Returns how many were freed."""
    return DECODERS.release(gpu)


@atexit.register
def _release_at_exit() -> None:  # while CUDA and PyNvVideoCodec are still loaded, not in module teardown
    try:
        DECODERS.release()
    except Exception:  # noqa: BLE001 - nothing to report to at exit
        pass
