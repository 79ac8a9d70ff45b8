from click.testing import CliRunner

from toolchain.cli import cli


def test_every_command_has_help():
    runner = CliRunner()
    top = runner.invoke(cli, ["--help"])
    assert top.exit_code == 0 and "Usage: " in top.output
    assert set(cli.commands) >= {"export", "quantize", "doctor"}
    for name, command in cli.commands.items():
        result = runner.invoke(cli, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert command.help and command.help.split()[0] in result.output, name


def test_version_and_unknown_command():
    runner = CliRunner()
    assert runner.invoke(cli, ["--version"]).output.strip() == "trtc, version 0.1.0"
    assert runner.invoke(cli, ["frobnicate"]).exit_code == 2
