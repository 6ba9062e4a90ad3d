"""The flags of %%gpu and %gpu: every one explained, mistakes rejected before anything runs."""
from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from gpusession.notebook.magics import GPUMagics, _run_options

MAGICS = (GPUMagics.gpu_cell, GPUMagics.gpu_line)


@pytest.mark.parametrize("magic", MAGICS, ids=lambda m: m.__name__)
def test_every_flag_has_help_text(magic):
    for action in magic.parser._actions:
        assert action.help and len(action.help) > 20, f"{action.dest} of {magic.__name__} has no help"


def test_cell_magic_help_shows_usage_and_an_example_transcript():
    help_text = GPUMagics.gpu_cell.__doc__
    assert "%%gpu [N] [--min N] [--priority P]" in help_text
    assert "In [1]: %%gpu 2" in help_text and "Out[1]:" in help_text
    for flag in ("--min", "--priority", "--timeout", "--queue-timeout", "--out", "--no-out"):
        assert flag in help_text


@pytest.mark.parametrize("line, says", [
    ("two", "'two' is not a number of GPUs"),
    ("2 --priority urgent", "invalid choice: 'urgent'"),
    ("--timeout -5", "'-5' is not a time"),
    ("--queue-timeout soon", "'soon' is not a time"),
    ("--out 2x", "'2x' is not a variable name"),
    ("2 3", "unrecognized arguments: 3"),
])
def test_bad_cell_flags_are_usage_errors(line, says):
    with pytest.raises(UsageError, match=says):
        parse_argstring(GPUMagics.gpu_cell, line)


@pytest.mark.parametrize("line, says", [
    ("3 --min 4", "min_gpus"),
    ("0", "gpus must be more than 0"),
    ("--out a --no-out", "contradict"),
])
def test_flags_the_options_reject_are_usage_errors_too(line, says):
    with pytest.raises(UsageError, match=says):
        _run_options(parse_argstring(GPUMagics.gpu_cell, line))


def test_good_flags_become_run_options():
    options = _run_options(parse_argstring(GPUMagics.gpu_cell, "4 --min 4 --priority high --timeout 10m "
                                                               "--queue-timeout 30"))
    assert options.lease.gpus == 4 and options.lease.min_gpus == 4
    assert options.lease.priority.label == "high" and options.timeout_s == 600
    assert options.lease.queue_timeout_s == 30


def test_communication_flags_become_run_options():
    options = _run_options(parse_argstring(GPUMagics.gpu_cell, "2 --grad-compression powersgd --bucket-mb 50 "
                                                               "--precision bf16"))
    assert options.comm.grad_compression.value == "powersgd" and options.comm.bucket_mb == 50
    assert options.comm.precision.value == "bf16"


def test_the_grad_compression_flag_takes_powersgd_settings():
    options = _run_options(parse_argstring(GPUMagics.gpu_cell, "2 --grad-compression powersgd:rank=4,warmup=20"))
    assert options.comm.powersgd.rank == 4 and options.comm.powersgd.warmup_steps == 20
    plain = _run_options(parse_argstring(GPUMagics.gpu_cell, "2 --grad-compression powersgd"))
    assert (plain.comm.powersgd.rank, plain.comm.powersgd.warmup_steps) == (2, 10)


@pytest.mark.parametrize("line, says", [
    ("--grad-compression int8", "invalid choice: 'int8'"),
    ("--grad-compression powersgd:rank=0", "PowerSGD rank must be from 1 to 1024; got 0"),
    ("--precision fp8", "invalid choice: 'fp8'"),
    ("--bucket-mb big", "invalid float value: 'big'"),
])
def test_bad_communication_flags_are_usage_errors(line, says):
    with pytest.raises(UsageError, match=says):
        parse_argstring(GPUMagics.gpu_cell, line)


def test_a_bucket_of_no_size_is_refused_by_the_options():
    with pytest.raises(UsageError, match="bucket_mb must be more than 0"):
        _run_options(parse_argstring(GPUMagics.gpu_cell, "--bucket-mb 0"))


def test_min_below_n_makes_an_elastic_run():
    options = _run_options(parse_argstring(GPUMagics.gpu_cell, "4 --min 2"))
    assert (options.lease.workers, options.lease.min_workers) == (4, 2)


def test_line_magic_takes_status_or_release():
    assert parse_argstring(GPUMagics.gpu_line, "status").action == "status"
    with pytest.raises(UsageError):
        parse_argstring(GPUMagics.gpu_line, "")
    with pytest.raises(UsageError, match="invalid choice"):
        parse_argstring(GPUMagics.gpu_line, "stop")


@pytest.mark.parametrize("line, says", [
    ("2 -o run1", "-o NAME names a background run's handle: use it with --bg"),
    ("2 --bg -o 1run", "'1run' is not a Python name"),
])
def test_a_background_handle_name_is_checked_before_anything_is_leased(line, says):
    from gpusession.notebook.magics import _handle_name

    with pytest.raises(UsageError, match=says):
        _handle_name(parse_argstring(GPUMagics.gpu_cell, line))


def test_a_background_cell_gets_its_handle_name_or_the_default():
    from gpusession.notebook.magics import DEFAULT_HANDLE, _handle_name

    assert _handle_name(parse_argstring(GPUMagics.gpu_cell, "2 --bg -o run1")) == "run1"
    assert _handle_name(parse_argstring(GPUMagics.gpu_cell, "2 --bg")) == DEFAULT_HANDLE == "_run"


@pytest.mark.parametrize("line, gateway, says", [
    ("2 --detach", "/g.sock", "--detach needs --bg"),
    ("2 --bg --max-duration 1h", "/g.sock", "use it with --bg --detach"),
    ("2 --bg --detach", None, "embedded cluster"),
    ("2 --bg --detach --max-duration 0", "/g.sock", "more than 0"),
    ("2 --bg --detach --max-duration 90d", "/g.sock", "at most"),
])
def test_detach_mistakes_are_usage_errors_before_anything_is_leased(monkeypatch, tmp_path, line, gateway, says):
    from gpusession.gateway.client import GATEWAY_ENV
    from gpusession.notebook.magics import _detach_limit

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # no hub gateway and no cluster: the embedded one
    monkeypatch.setenv("GPUSESSION_HOME", str(tmp_path))
    if gateway:
        monkeypatch.setenv(GATEWAY_ENV, gateway)
    else:
        monkeypatch.delenv(GATEWAY_ENV, raising=False)
    with pytest.raises(UsageError, match=says):
        _detach_limit(parse_argstring(GPUMagics.gpu_cell, line))


def test_a_detached_cell_leaves_the_limit_to_the_gateways_default_or_names_its_own(monkeypatch):
    from gpusession.gateway.client import GATEWAY_ENV
    from gpusession.gateway.keeping import Detach
    from gpusession.notebook.magics import _detach_limit

    monkeypatch.setenv(GATEWAY_ENV, "/g.sock")
    assert _detach_limit(parse_argstring(GPUMagics.gpu_cell, "2 --bg")) is None
    assert _detach_limit(parse_argstring(GPUMagics.gpu_cell, "2 --bg --detach")) == Detach(None)
    assert _detach_limit(parse_argstring(GPUMagics.gpu_cell, "2 --bg --detach --max-duration 2h")) == Detach(7200.0)


def test_attach_needs_an_id_and_a_python_name_and_the_other_actions_take_neither():
    from gpusession.notebook.magics import attach_run

    with pytest.raises(UsageError, match="needs the run's id"):
        attach_run(None, None, "r1")
    with pytest.raises(UsageError, match="not a Python name"):
        attach_run(None, "a" * 32, "1x")
    args = parse_argstring(GPUMagics.gpu_line, "attach abc -o r1")
    assert (args.action, args.run_id, args.handle) == ("attach", "abc", "r1")
    with pytest.raises(UsageError, match="takes no ID"):
        GPUMagics(shell=None).gpu_line("status abc")
