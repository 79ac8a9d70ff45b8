"""engines.video.FramePusher on the CPU with the real Lite0 and real footage: bikes.mp4 decoded here by PyAV and
pushed as NumPy frames gives what classify() gives decoding the same file itself."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.conftest import needs_export

pytestmark = needs_export


@pytest.fixture(scope="module")
def frames(bikes):
    """bikes.mp4 decoded by PyAV: (NV12 array, RGB array, pts, colour space) per frame."""
    import av

    from engines.video.sources import _colorspace_from_av

    out = []
    with av.open(str(bikes)) as c:
        for f in c.decode(video=0):
            out.append((f.to_ndarray(format="nv12"), f.to_ndarray(format="rgb24"), f.pts,
                        str(_colorspace_from_av(f, f.height, None))))
    return out


@pytest.fixture(scope="module")
def classified(bikes, engine):
    from engines.video import classify

    run = classify([bikes], engine, batch=8, top_k=5)
    preds = sorted(run, key=lambda p: p.frame)
    assert run.ok and len(preds) == 250
    return preds


def test_pushed_nv12_frames_give_what_classify_gives(engine, frames, classified):
    from engines.video import FramePusher

    assert len({cs for *_, cs in frames}) == 1
    with FramePusher(engine, batch=8, top_k=5, on_lag="block", colorspace=frames[0][3], format="NV12") as p:
        for i, (nv12, _rgb, pts, _cs) in enumerate(frames):
            assert p.push("bikes", nv12, pts=pts, time=pts / 12800, frame_id=i) is None  # NumPy: read already
        p.close()
        preds = list(p.results())
    assert [q.frame for q in preds] == list(range(250))
    assert [q.pts for q in preds] == [c.pts for c in classified]
    top1 = np.mean([q.indices[0] == c.indices[0] for q, c in zip(preds, classified, strict=True)])
    worst = max(np.abs(np.subtract(q.scores, c.scores)).max() for q, c in zip(preds, classified, strict=True))
    print(f"pushed NV12 vs classify on bikes.mp4: top-1 agreement {top1:.2%}, largest score difference {worst:.1e}")
    assert top1 == 1.0 and worst < 1e-5
    assert preds[0].labels == classified[0].labels
    assert p.stats.per_source == {"bikes": 250} and not p.stats.dropped


def test_rgb_and_bgr_frames_from_threads(engine, frames, classified):
    """Two streams pushed by two threads each: RGB frames as PyAV converts them, and the same pixels as BGR (the
    channel order OpenCV uses) must classify identically; against classify's NV12 maths the top-1 agreement is
    at least 90% (swscale interpolates chroma, trtc takes the nearest sample)."""
    from engines.video import FramePusher

    with FramePusher(engine, batch=8, top_k=5, on_lag="block") as p:
        def produce(name, fmt, part):
            for i in range(2 * part, 250, 4):  # every other frame, shared by two threads
                rgb = frames[i][1]
                p.push(name, rgb if fmt == "RGB" else rgb[:, :, ::-1].copy(), format=fmt, frame_id=i)
        threads = [threading.Thread(target=produce, args=(n, f, k)) for n, f in (("rgb", "RGB"), ("bgr", "BGR"))
                   for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    preds = list(p.results())
    by = {name: {q.frame: q for q in preds if q.source == name} for name in ("rgb", "bgr")}
    assert sorted(by["rgb"]) == sorted(by["bgr"]) == list(range(0, 250, 2))
    for i in range(0, 250, 2):
        assert by["rgb"][i].indices == by["bgr"][i].indices
        np.testing.assert_allclose(by["rgb"][i].scores, by["bgr"][i].scores, atol=1e-6)
    top1 = np.mean([by["rgb"][c.frame].indices[0] == c.indices[0] for c in classified[::2]])
    print(f"pushed RGB (swscale) vs classify (NV12): top-1 agreement {top1:.2%}")
    assert top1 >= 0.9


def test_a_wrong_frame_mid_stream_is_refused_and_the_rest_classified(engine, frames):
    from engines.errors import UsageProblem
    from engines.video import FramePusher

    with FramePusher(engine, batch=4, top_k=1, on_lag="block", format="NV12") as p:
        for i in range(10):
            if i == 5:
                with pytest.raises(UsageProblem, match="even-sized") as e:
                    p.push("bikes", frames[i][0][:-1])  # one row short: not an NV12 picture
                print(f"refused: {e.value}")
            p.push("bikes", frames[i][0], frame_id=i)
    assert [q.frame for q in p.results()] == list(range(10))


def test_a_greyscale_frame_without_format_is_refused(engine, frames):
    """A 2-D greyscale picture (a grey bikes.mp4 frame, 270 x 640: a shape that also fits an NV12 surface of a
    180 x 640 picture) pushed without format= is refused, not read as NV12; pushed as RGB (the grey repeated) it is
    classified."""
    from engines.errors import UsageProblem
    from engines.video import FramePusher

    grey = np.ascontiguousarray(frames[0][1][:270].mean(axis=2).round().astype(np.uint8))
    with FramePusher(engine, batch=1, top_k=1, on_lag="block") as p:
        with pytest.raises(UsageProblem, match="NV12 surface .* or a greyscale picture"):
            p.push("grey", grey)
        p.push("grey", np.repeat(grey[:, :, None], 3, axis=2), format="RGB")
    assert [q.source for q in p.results()] == ["grey"]
