"""grad_compression, bucket_mb and precision: checked before anything is leased, with errors that
name the option and what to write instead."""
from __future__ import annotations

import pytest

import gpusession as gs
from gpusession.run.comm_options import (CommOptions, CommReport, Compression, PowerSGD, Precision,
                                     validate_comm_options)
from gpusession.run.caller.options import validate_run_options


def test_the_options_parse_into_enums():
    options = validate_run_options(grad_compression="PowerSGD", bucket_mb=50, precision="bf16").comm
    assert options == CommOptions(Compression.POWERSGD, 50.0, Precision.BF16, PowerSGD(rank=2, warmup_steps=10))
    assert validate_run_options().comm.is_default


@pytest.mark.parametrize("options, says", [
    ({"grad_compression": "int8"}, "grad_compression must be None, 'fp16', 'bf16', 'powersgd'; got 'int8'"),
    ({"grad_compression": True}, "grad_compression must be None"),
    ({"precision": "fp8"}, "precision must be None, 'bf16', 'fp16'; got 'fp8'"),
    ({"bucket_mb": 0}, "bucket_mb must be more than 0"),
    ({"bucket_mb": float("nan")}, "bucket_mb must be more than 0"),
    ({"bucket_mb": "25MB"}, "bucket_mb must be a number of megabytes"),
])
def test_bad_values_are_refused_at_decoration_naming_the_option(options, says):
    with pytest.raises((ValueError, TypeError), match=says.replace("(", r"\(").replace(")", r"\)")):
        gs.distributed(gpus=2, **options)  # raises here: nothing was asked of the cluster yet


def test_the_receipt_part_names_what_was_used_and_the_bytes():
    options = validate_comm_options(grad_compression="powersgd", bucket_mb=10)
    report = CommReport(options, applied=True, steps=5, bytes_last_step=1_284, fp32_bytes_per_step=8_708)
    assert report.summary() == ("grads powersgd (rank 2, after 10 steps) · bucket 10 MB · "
                                "0.00128 MB all-reduced per step per rank (fp32: 0.00871 MB)")


def test_fp16_precision_says_how_many_steps_scaled_the_loss():
    report = CommReport(validate_comm_options(precision="fp16"), applied=True, scaled_steps=3)
    assert report.summary() == "fp16 autocast · loss scaled in 3 gs.step calls"


def test_options_never_applied_are_said_so():
    report = CommReport(validate_comm_options(grad_compression="bf16"), applied=False)
    assert "NOT applied" in report.summary()


def test_powersgd_settings_are_an_option_and_the_string_keeps_rank_2_after_10_steps():
    chosen = validate_run_options(grad_compression=gs.PowerSGD(rank=4, warmup_steps=20)).comm
    assert chosen.grad_compression is Compression.POWERSGD and chosen.powersgd == PowerSGD(4, 20)
    assert validate_comm_options(grad_compression="powersgd").powersgd == PowerSGD(rank=2, warmup_steps=10)
    assert validate_comm_options(grad_compression="fp16").powersgd is None
    assert chosen.describe() == "grads powersgd (rank 4, after 20 steps)"


@pytest.mark.parametrize("settings, says", [
    ({"rank": 0}, "PowerSGD rank must be from 1 to 1024; got 0"),
    ({"rank": 2.5}, "PowerSGD rank must be a whole number"),
    ({"rank": True}, "PowerSGD rank must be a whole number"),
    ({"warmup_steps": 1}, "PowerSGD warmup_steps must be from 2 to"),
    ({"warmup_steps": "10"}, "PowerSGD warmup_steps must be a whole number"),
])
def test_bad_powersgd_settings_are_refused_naming_the_field(settings, says):
    with pytest.raises((ValueError, TypeError), match=says):
        gs.PowerSGD(**settings)


def test_the_text_form_names_rank_and_warmup_and_refuses_anything_else():
    assert validate_comm_options(grad_compression="powersgd:rank=4,warmup=20").powersgd == PowerSGD(4, 20)
    assert validate_comm_options(grad_compression="PowerSGD:rank=8").powersgd == PowerSGD(8, 10)
    with pytest.raises(ValueError, match="'depth=3' is not rank=R or warmup=S"):
        validate_comm_options(grad_compression="powersgd:depth=3")
    with pytest.raises(ValueError, match="is not 'powersgd:rank=R,warmup=S'"):
        validate_comm_options(grad_compression="fp16:rank=4")
