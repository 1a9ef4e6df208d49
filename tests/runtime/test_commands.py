"""Every command of the registry answers ``--help`` (its module imports and its parser builds)."""

import pytest

from jaxlib_ext import cli


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_command_answers_help(command, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--help"])
    assert stop.value.code == 0
    assert f"python -m jaxlib_ext {command}" in capsys.readouterr().out
