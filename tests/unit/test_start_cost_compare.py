"""examples/torch_start_cost.py's comparison of two trees (--against): which later starts count for which tree, the
medians and the ratio to the first start; a folder that is not a trtc checkout is refused before any start."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("torch_start_cost", ROOT / "examples" / "torch_start_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_medians_per_tree_over_the_first_start(tmp_path):
    mod = _module()
    rows = [("first", {"total_s": 20.0, "compiled_s": 20.0}),
            ("this 1", {"total_s": 3.0, "compiled_s": 7.0}), ("against 1", {"total_s": 4.0, "compiled_s": 6.0}),
            ("against 2", {"total_s": 5.0, "compiled_s": 6.5}), ("this 2", {"total_s": 2.0, "compiled_s": 9.0}),
            ("this 3", {"total_s": 2.2, "compiled_s": 7.5}), ("against 3", {"total_s": 4.1, "compiled_s": 5.0})]
    got = mod.compare(rows, tmp_path)
    assert got["this"]["first_results_s"] == [3.0, 2.0, 2.2] and got["this"]["first_result_s"] == 2.2  # medians
    assert got["this"]["of_first"] == pytest.approx(0.11) and got["this"]["compiled_s"] == 7.5
    assert got["against"]["first_results_s"] == [4.0, 5.0, 4.1] and got["against"]["first_result_s"] == 4.1
    assert got["against"]["compiled_s"] == 6.0 and got["against"]["tree"] == str(tmp_path)
    assert got["this"]["tree"] == str(ROOT)


def test_against_a_folder_that_is_not_a_checkout_is_refused(tmp_path, capsys):
    mod = _module()
    model = tmp_path / "m.pt2"
    model.write_bytes(b"")
    started = []
    mod.start = lambda *a, **k: started.append(a)
    cache = tmp_path / "m.pt2.inductor"
    cache.mkdir()
    (cache / "kept.aot").write_bytes(b"a function")
    with pytest.raises(SystemExit):
        mod.main([str(model), "--against", str(tmp_path)])
    assert "not a trtc checkout" in capsys.readouterr().err and started == []
    assert (cache / "kept.aot").exists()  # refused before the model's cache is emptied
    with pytest.raises(SystemExit):
        mod.main([str(model), "--against", str(ROOT), "--profile", "5"])
    assert "--profile" in capsys.readouterr().err and started == [] and (cache / "kept.aot").exists()
