"""Tables printed to a pipe (80 columns) wrap their headers between words and never cut one ("top-1 (decisi...")."""

from __future__ import annotations

from click.testing import CliRunner

from toolchain.cli import cli


def test_validate_headers_whole_when_piped(lite0_onnx, photos, tmp_path):
    import shutil

    for p in photos:
        shutil.copy(p, tmp_path)
    model = str(lite0_onnx[0])
    r = CliRunner().invoke(cli, ["validate", "--reference", model, "--candidate", model, "--data", str(tmp_path)])
    assert r.exit_code == 0, r.output
    table = r.stdout
    assert "…" not in table and "..." not in table, table
    assert "(decisive)" in table and "verdict" in table, table
