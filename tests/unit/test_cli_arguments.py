"""Bad input on every `gpusession` command and option is refused before anything runs: argparse's
exit status 2, a message naming the option and what to write, and no handler called (so nothing
reaches the broker, a cluster or JupyterLab). Pure argument parsing: no Ray, no server."""
from __future__ import annotations

import pytest

from gpusession.cli import main as cli, cluster as cli_cluster

BAD = [  # (argv, the option the message names, words saying what to write)
    (["revoke", "abc"], "argument ID", "a lease id"),
    (["revoke", "0"], "argument ID", "from 1 to"),
    (["revoke", "--", "-5"], "argument ID", "from 1 to"),
    (["revoke", "9" * 30], "argument ID", "whole number"),
    (["revoke"], "ID", "required"),
    (["lab", "--port", "0"], "argument --port", "a TCP port such as 8890"),
    (["lab", "--port", "70000"], "argument --port", "from 1 to 65535"),
    (["lab", "--port", "http"], "argument --port", "a TCP port"),
    (["lab", "--gpus", "0"], "argument --gpus", "a number of logical GPUs such as 4"),
    (["lab", "--gpus", "two"], "argument --gpus", "whole number"),
    (["lab", "--notebook-dir", "/nonexistent/folder"], "argument --notebook-dir", "an existing folder"),
    (["demo", "--timeout", "0"], "argument --timeout", "more than 0"),
    (["demo", "--timeout", "nan"], "argument --timeout", "more than 0"),
    (["demo", "--timeout=-inf"], "argument --timeout", "more than 0"),
    (["demo", "--notebook", "/nonexistent/x.ipynb"], "argument --notebook", "an existing .ipynb file"),
    (["demo", "--notebook", "notes.txt"], "argument --notebook", ".ipynb"),
    (["cluster", "start", "--gpus", "0"], "argument --gpus", "at least 1 (such as 4)"),
    (["cluster", "start", "--gpus", "x"], "argument --gpus", "such as 4"),
    (["cluster", "start", "--timeout=-1"], "argument --timeout", "more than 0 such as 120"),
    (["cluster", "start", "--timeout", "inf"], "argument --timeout", "more than 0"),
    (["cluster"], "required", "{start,stop,status}"),
    (["quota", "set", "alice", "--max-priority", "urgent"], "argument --max-priority", "'low', 'normal', 'high'"),
    (["quota", "set", "alice", "--max-gpus=-1"], "argument --max-gpus", "'none' for no limit"),
    (["quota", "set", "alice", "--max-gpus", "nan"], "argument --max-gpus", "a number >= 0"),
    (["quota", "set", "alice", "--gpu-hours", "inf"], "argument --gpu-hours", "a number >= 0"),
    (["quota", "set", "alice", "--gpu-hours", "lots"], "argument --gpu-hours", "a number >= 0"),
    (["quota", "set", "", "--max-gpus", "1"], "argument user", "1-256 printable characters"),
    (["quota", "get", "a\x00b"], "argument user", "printable"),
    (["quota", "reset", "x" * 300], "argument user", "1-256"),
    (["usage", "--by", "week"], "argument --by", "'user', 'day'"),
    (["usage", "--since", "yesterday"], "argument --since", "YYYY-MM-DD"),
    (["usage", "--until", "2024-13-01"], "argument --until", "YYYY-MM-DD"),
    (["usage", "--since", "2024-02-01", "--until", "2024-01-01"], "argument --since", "after --until"),
    (["leases", "--limit", "3"], "unrecognized arguments", "--limit"),
    (["status", "extra"], "unrecognized arguments", "extra"),
    (["nonsense"], "argument COMMAND", "invalid choice"),
]


@pytest.fixture
def nothing_runs(monkeypatch):
    """Any handler or broker access would be a change: each fails the test if reached."""
    def reached(*args, **kwargs):
        pytest.fail("a refused command reached its handler")

    for name in ("_broker", "_ray_access", "_status_quickly", "_lab", "_demo"):
        monkeypatch.setattr(cli, name, reached)
    for name in ("_start", "_stop", "_status"):
        monkeypatch.setattr(cli_cluster, name, reached)


@pytest.mark.parametrize("argv, option, words", BAD, ids=[" ".join(a)[:50] for a, _, _ in BAD])
def test_bad_input_is_refused_naming_the_option_and_what_to_write_and_nothing_runs(argv, option, words, capsys,
                                                                                   nothing_runs):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert option in err and words in err, err
    assert err.startswith("usage: gpusession"), err  # the command's usage line says what it takes


def test_quota_set_without_a_field_is_refused_naming_the_three_before_the_broker_is_asked(capsys, nothing_runs):
    assert cli.main(["quota", "set", "alice"]) == 1
    assert "give at least one of --max-gpus, --gpu-hours, --max-priority" in capsys.readouterr().err


def test_good_input_parses_to_the_values_the_handlers_get():
    parser = cli.build_parser()
    assert parser.parse_args(["revoke", "17"]).lease_id == 17
    change = parser.parse_args(["quota", "set", "alice", "--max-gpus", "none", "--gpu-hours", "0.5",
                                "--max-priority", "HIGH"])
    assert (change.max_gpus, change.gpu_hours, change.max_priority) == (None, 0.5, "high")
    usage = parser.parse_args(["usage", "--since", "2024-01-01", "--until", "2024-02-01", "--by", "day"])
    assert usage.until - usage.since == 31 * 86400 and usage.by == "day"
    assert parser.parse_args(["cluster", "start", "--gpus", "2", "--timeout", "30"]).timeout == 30.0
    assert parser.parse_args(["demo", "--timeout", "60"]).timeout == 60.0
    assert parser.parse_args(["lab", "--port", "8890", "--gpus", "2"]).gpus == 2


def test_the_same_day_as_since_and_until_is_not_reversed(nothing_runs, monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "_usage", lambda args: calls.append((args.since, args.until)) or 0)
    parser = cli.build_parser()
    args = parser.parse_args(["usage", "--since", "2024-01-01", "--until", "2024-01-01"])
    cli._check_together(parser, args)  # no SystemExit
    assert args.since == args.until


def test_every_command_and_option_has_help_text():
    parser = cli.build_parser()
    missing = []

    def walk(p, where):
        for action in p._actions:
            if action.choices and hasattr(action.choices, "items"):
                for name, child in action.choices.items():
                    walk(child, f"{where} {name}")
            elif action.dest not in ("help",) and not action.help and action.option_strings:
                missing.append(f"{where} {'/'.join(action.option_strings)}")

    walk(parser, "gpusession")
    assert missing == [], f"options without help text: {missing}"
