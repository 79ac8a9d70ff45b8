"""`trtc run VIDEO --model M --device D` opens the engine and starts the pipeline as the library's short job does,
``classify([VIDEO], open_engine(M, device=D))``: the same options reach open_engine (none besides the device, so
the engine's defaults, quick start included, apply) and classify gets no batch of its own (the manifest's, which
the engine prepared at open)."""

from __future__ import annotations

from click.testing import CliRunner

from toolchain.cli import cli


def test_trtc_run_reaches_open_engine_and_classify_with_the_library_s_options(tmp_path, monkeypatch, bikes):
    import engines
    import engines.video

    model = tmp_path / "m.onnx"
    model.write_bytes(b"not read: open_engine is recorded")
    clip = bikes  # a real video: run refuses a source that is plainly no video before any engine opens
    seen = {}

    class Engine:
        def close(self):
            seen["closed"] = True

    def open_engine(path, *args, **kwargs):
        seen["open"] = (str(path), args, kwargs)
        return Engine()

    def classify(sources, engine, **kwargs):
        seen["classify"] = (list(sources), kwargs)
        raise KeyboardInterrupt  # enough: what reached the library is recorded

    monkeypatch.setattr(engines, "open_engine", open_engine)
    monkeypatch.setattr(engines.video, "classify", classify)
    CliRunner().invoke(cli, ["run", str(clip), "--model", str(model), "--device", "cuda:0"])
    assert seen["open"] == (str(model), (), {"device": "cuda:0"})
    sources, kwargs = seen["classify"]
    assert sources == [str(clip)]
    assert kwargs.get("batch") is None and kwargs.get("decoder") == "auto" and kwargs.get("max_wait_ms") == 100.0
