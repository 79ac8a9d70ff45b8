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


def test_the_top_help_lists_the_commands_once_and_whole():
    """Issue 25 item 10: the commands were listed twice, the second time (click's) cut off with '...'."""
    out = CliRunner().invoke(cli, ["--help"]).output
    assert "Commands:" not in out and "...\n" not in out.split("\n", 1)[1], out
    intro = out.split("Options:")[0]
    for name in cli.commands:
        assert intro.count(f"\n  {name} ") == 1, f"{name} not introduced once:\n{out}"


def test_every_choice_takes_any_case():
    """--precision FP16 was refused while --color rgb was taken: every choice of every command takes any case and
    gives the value as the option lists it."""
    import click

    choices = [(name, p) for name, c in cli.commands.items() for p in c.params if isinstance(p.type, click.Choice)]
    assert len(choices) > 10
    for name, p in choices:
        for choice in p.type.choices:
            assert p.type.convert(choice.upper(), p, None) == choice, (name, p.name)
            assert p.type.convert(choice.lower(), p, None) == choice, (name, p.name)
    r = CliRunner().invoke(cli, ["quantize", "nope.onnx", "--precision", "FP16"])
    assert r.exit_code == 2 and "model not found" in r.output and "Invalid value" not in r.output
