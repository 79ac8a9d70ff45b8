"""`trtc validate --fix` on real models and data: plain INT8 EfficientNet-Lite0 (about 83% top-1 agreement, below the
gate) is remade with the fewest layers kept out of INT8 - no more than the accuracy-aware search keeps for 97% - and
the model passes validate; the printed `trtc quantize` command, run through the CLI, makes the same bytes. FP16
Lite0 under a stricter cosine than FP16's default is remade with layers kept in FP32, and passes."""

from __future__ import annotations

import shlex

from tests.conftest import needs_export, needs_quant


def _same_bytes_from_the_command(report, folder, extra: str = "") -> bool:
    from click.testing import CliRunner

    from engines._io import sha256_file
    from toolchain.cli import cli

    again = folder / "again.onnx"
    line = report.command.replace(shlex.quote(report.output), str(again)) + extra
    r = CliRunner().invoke(cli, shlex.split(line)[1:])
    assert r.exit_code == 0, f"{line}\n{r.output}"
    return sha256_file(again) == sha256_file(report.output)


@needs_export
@needs_quant
def test_fix_plain_int8_lite0(lite0_onnx, lite0_int8_plain, lite0_int8, bikes, tmp_path):
    from toolchain.fix import fix_candidate

    cache = lite0_int8.calibration["cache"]  # the calibration both fixtures read
    report = fix_candidate(str(lite0_onnx[0]), lite0_int8_plain.output, [str(bikes)], output=str(tmp_path / "f.onnx"),
                           samples=8, count=32, calib_cache=cache)
    before = report.validate["candidates"][0]
    assert not before["passed"] and before["metrics"]["top1_agreement"] < 0.95
    after = report.fixed["candidates"][0]
    assert report.fixed["passed"] and after["metrics"]["top1_agreement"] >= 0.95, after
    # no more layers kept than the accuracy-aware search keeps for 97% (46 of 50 when this was written)
    assert 1 <= len(report.kept) <= lite0_int8.layers["kept"], (report.kept, lite0_int8.layers)
    ranking = [before["layers"]["rows"][i]["node"] for i in before["layers"]["worst"]]
    assert report.kept == ranking[:len(report.kept)]  # the per-layer report's worst layers, in its order
    assert report.trail[-1]["passed"] or any(t["passed"] and t["kept"] == len(report.kept) for t in report.trail)
    assert all("--keep-fp32 " + k in report.command for k in report.kept)
    assert _same_bytes_from_the_command(report, tmp_path, f" --calib-cache {cache}")


@needs_export
@needs_quant
def test_fix_fp16_lite0_under_a_stricter_cosine(lite0_onnx, lite0_fp16, bikes, tmp_path):
    from toolchain.fix import fix_candidate

    strict = {"min_cosine": 0.99999}  # FP16 Lite0 gives 0.99998 on these frames; FP16's default gate is 0.999
    report = fix_candidate(str(lite0_onnx[0]), lite0_fp16.output, [str(bikes)], output=str(tmp_path / "f.onnx"),
                           samples=8, count=32, thresholds=strict)
    assert not report.validate["passed"] and report.fixed["passed"], report.trail
    assert report.fixed["candidates"][0]["metrics"]["cosine"] >= 0.99999
    assert 1 <= len(report.kept) < 20 and all(t["top1_agreement"] == 1.0 for t in report.trail)
    assert _same_bytes_from_the_command(report, tmp_path)
