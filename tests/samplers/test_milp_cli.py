"""``python -m jaxlib_ext milp``: a real MIPLIB file end to end, and bad input."""

import pytest

from jaxlib_ext import cli
from jaxlib_ext.cli import milp as cli_milp
from jaxlib_ext.samplers import milp


def test_cli_solves_p0033(capsys, tmp_path):
    sol = tmp_path / "x.sol"
    rc = cli.main(["milp", str(milp.miplib_path("p0033")), "--time-limit", "3", "--chains", "8",
                   "--no-progress", "--compare-highs", "--solution", str(sol)])
    out = capsys.readouterr().out
    assert rc == 0 and "feasible: True" in out and "highs: status optimal" in out
    lines = sol.read_text().splitlines()
    assert len(lines) == 33
    x = [float(line.split()[1]) for line in lines]
    p = milp.read_mps(milp.miplib_path("p0033"))
    assert milp.check_solution(p, x).feasible


@pytest.mark.parametrize("argv, match", [
    (["missing.mps"], "no such file"),
    (["BAD", "--time-limit", "0"], "--time-limit"),
])
def test_cli_bad_input(argv, match, capsys, tmp_path):
    if argv[0] == "BAD":
        argv[0] = str(milp.miplib_path("p0033"))
    else:
        argv[0] = str(tmp_path / argv[0])
    assert cli_milp.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and match in err


def test_cli_malformed_file(capsys, tmp_path):
    f = tmp_path / "bad.mps"
    f.write_text("NAME x\nROWS\n N obj\nCOLUMNS\nRHS\nENDATA\n")
    assert cli_milp.main([str(f), "--no-progress"]) == 2
    assert "error: " in capsys.readouterr().err


def test_cli_parser_prog():
    assert cli_milp.build_parser().prog == "python -m jaxlib_ext milp"
