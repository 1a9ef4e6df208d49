"""``python -m jaxlib_ext milp``: a real MIPLIB file end to end, and bad input."""

import json

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


def test_cli_parser_prog_and_rules():
    parser = cli_milp.build_parser()
    assert parser.prog == "python -m jaxlib_ext milp"
    assert parser.parse_args(["x.mps", "--rule", "dmala"]).rule == "dmala"
    with pytest.raises(SystemExit):
        parser.parse_args(["x.mps", "--rule", "gibbs"])


def test_cli_progress_bar_shows_time_and_best(capsys):
    rc = cli_milp.main([str(milp.miplib_path("p0033")), "--time-limit", "1", "--chains", "4"])
    captured = capsys.readouterr()
    assert rc in (0, 1) and "compile_seconds: " in captured.out
    assert "best=none, t=" in captured.err  # the time shows before a first feasible point
    assert "s]" in captured.err and "t=" in captured.err.rsplit("best=", 1)[1]


@pytest.mark.parametrize("case", ["missing", "features", "metropolis"])
def test_cli_bad_proposal(case, capsys, tmp_path):
    argv = [str(milp.miplib_path("p0033")), "--no-progress"]
    if case == "missing":
        argv += ["--proposal", str(tmp_path / "nowhere")]
    elif case == "features":  # a proposal saved by a network with other feature sizes
        (tmp_path / "proposal.json").write_text(json.dumps(
            {"config": {"hidden": 8, "num_layers": 1, "init_move_logit": -3.0,
                        "var_features": 99, "con_features": 99}, "meta": {}}))
        argv += ["--proposal", str(tmp_path)]
    else:
        argv += ["--metropolis"]
    assert cli_milp.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert ("metropolis" if case == "metropolis" else "proposal") in err


def test_cli_solves_with_a_saved_proposal(capsys, tmp_path):
    proposal_mod = pytest.importorskip("jaxlib_ext.samplers.milp.proposal")
    from flax import nnx

    proposal_mod.save_proposal(tmp_path / "prop",
                               proposal_mod.LearnedProposal(8, 1, rngs=nnx.Rngs(0)))
    rc = cli_milp.main([str(milp.miplib_path("p0033")), "--time-limit", "2", "--chains", "4",
                        "--no-progress", "--proposal", str(tmp_path / "prop"), "--metropolis"])
    out = capsys.readouterr().out
    assert rc in (0, 1) and "rule: langevin-learned-mh" in out
