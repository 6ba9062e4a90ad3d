"""benchmarks/scaling.py's rows (pure logic): each configuration compares gpusession's samples/s
with torchrun's from the same samples, and states the scaling efficiency of each launcher
against its own 1-rank figure; compression rows compare gpusession's option with its plain DDP."""
from __future__ import annotations

import importlib.util
import sys

from ..conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_scaling", ROOT / "benchmarks" / "scaling.py")
scaling = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = scaling  # its dataclass looks its module up by name
spec.loader.exec_module(scaling)


def result(samples_per_s: float, loss: float = 0.1, sent: float = 6.3e6) -> dict:
    return {"samples_per_s": samples_per_s, "loss": loss, "bytes_per_step": sent, "fp32_grad_bytes": 12.6e6}


def measured_where_gpusession_gives(fraction: float) -> dict:
    """Every configuration measured 3 times: torchrun 100, 110, 120 samples/s for one rank and
    twice that for two; gpusession `fraction` of torchrun's; compressions 2x gpusession's plain."""
    measured = {}
    for config in scaling.configurations():
        base = [100.0, 110.0, 120.0] if config.ranks == 1 else [200.0, 220.0, 240.0]
        if config.compression != "none":
            base = [2 * fraction * value for value in base]
        for launcher in config.launchers:
            share = fraction if launcher == scaling.GPUSESSION and config.compression == "none" else 1.0
            measured[(config, launcher)] = [result(value * share) for value in base]
    return measured


STEPS = scaling.Steps(compute=50, link={}, fixed_link=5)  # --steps 5


def test_each_configuration_is_one_row_of_gpusession_against_torchrun_with_its_ratio():
    rows = [row.as_json() for row in scaling.rows(measured_where_gpusession_gives(0.9), steps=STEPS)]
    launcher_rows = [row for row in rows if row["alternative"] == "torchrun, one launcher per host"]
    assert len(launcher_rows) == 10  # 2 models x (1 rank, packed, 2 links, an impaired link)
    assert all(row["ratio"] == 0.9 and row["goal"] == ">= 0.97" for row in launcher_rows)
    assert launcher_rows[0]["gpusession_samples"] == [90.0, 99.0, 108.0]
    assert launcher_rows[0]["alternative_samples"] == [100.0, 110.0, 120.0]
    packed = next(row for row in launcher_rows if row["measure"].startswith("link-bound model, 2 ranks, 1 host"))
    assert "scaling efficiency (samples/s / 2 x 1 rank's): gpusession 1.00, torchrun 1.00" in packed["note"]
    assert "placement='pack'" in packed["configured"]
    delayed = launcher_rows[4]
    assert delayed["measure"] == "link-bound model, 2 ranks, 2 hosts, 200 Mbit/s, one link +20 ms each way: samples/s"
    assert "5 timed steps" in delayed["configured"]
    lossy = launcher_rows[9]
    assert lossy["measure"] == ("compute-bound model, 2 ranks, 2 hosts, 200 Mbit/s, one link +20 ms each way "
                                "and 1.0% loss: samples/s")
    compute = next(row for row in launcher_rows if row["measure"].startswith("compute-bound model, 1 rank"))
    assert "50 timed steps" in compute["configured"]  # its own count: calibrated to >= 5 s a sample


def test_each_compute_bound_configuration_has_a_torchrun_control_with_gpusessions_malloc_settings():
    rows = [row.as_json() for row in scaling.rows(measured_where_gpusession_gives(0.9), steps=STEPS)]
    controls = [row for row in rows if "malloc settings" in row["alternative"]]
    assert len(controls) == 5 and all(row["measure"].startswith("compute-bound model") for row in controls)
    assert all(row["measure"].endswith("(control: torchrun with gpusession's malloc settings)") for row in controls)
    assert "MALLOC_TRIM_THRESHOLD_=268435456, MALLOC_MMAP_THRESHOLD_=33554432" in controls[0]["alternative"]
    from gpusession.run.rank.heap import MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES

    assert scaling.MALLOC_SETTINGS == {"MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES),
                                       "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES)}


def test_calibrated_link_bound_configurations_each_state_their_own_steps_and_compression_takes_its_plain_ones():
    plain = [c for c in scaling.configurations() if c.model == "link" and c.compression == "none"]
    steps = scaling.Steps(compute=50, link={config: 100 + i for i, config in enumerate(plain)})
    rows = [row.as_json() for row in scaling.rows(measured_where_gpusession_gives(0.9), steps=steps)]
    for i, config in enumerate(plain):
        [row] = [r for r in rows if r["measure"] == f"link-bound model, {config.where}: samples/s"]
        assert f"11 warm-up and {100 + i} timed steps" in row["configured"]
    compressed = [r for r in rows if "grad_compression=" in r["measure"]]
    at_200 = 100 + next(i for i, c in enumerate(plain) if c.rate_mbit == 200 and not c.delay_ms)
    assert len(compressed) == 3 and all(f"then {at_200} timed" in r["configured"] for r in compressed)


def test_compute_bound_samples_get_enough_steps_to_last_at_least_five_seconds():
    steps = scaling.sample_steps(seconds_per_step=0.0007)
    assert steps * 0.0007 >= 5.0 * 1.5 and steps * 0.0007 < 8.0
    assert scaling.sample_steps(seconds_per_step=10.0) == 1


def test_only_the_second_hosts_link_carries_the_delay_and_loss():
    class Cluster:
        workers = ["host1", "host2"]
        shaped: list = []

        def shape_link(self, host, **how):
            self.shaped.append((host, how))

        def unshape_link(self, host):
            self.shaped.append((host, None))

    cluster = Cluster()
    delayed = next(c for c in scaling.configurations() if c.delay_ms)
    scaling.shape(cluster, delayed)
    assert cluster.shaped == [("host1", {"rate_mbit": 200}),
                              ("host2", {"rate_mbit": 200, "delay_ms": 20.0, "loss": 0.0})]
    cluster.shaped.clear()
    lossy = next(c for c in scaling.configurations() if c.loss)
    scaling.shape(cluster, lossy)
    assert lossy.model == "compute"
    assert cluster.shaped == [("host1", {"rate_mbit": 200}),
                              ("host2", {"rate_mbit": 200, "delay_ms": 20.0, "loss": 0.01})]


def test_a_compression_row_compares_gpusession_with_its_own_plain_ddp_and_states_both_losses():
    rows = [row.as_json() for row in scaling.rows(measured_where_gpusession_gives(0.9), steps=STEPS)]
    fp16 = next(row for row in rows if row["measure"].endswith("grad_compression=fp16"))
    assert fp16["ratio"] == 2.0 and fp16["goal"] == ">= 1.6"
    assert "loss after 16 steps 0.1000 vs plain 0.1000" in fp16["note"]
    assert "6.3 MB (fp32 gradients: 12.6 MB)" in fp16["note"]


def test_rows_of_a_partial_run_leave_out_what_was_not_measured_yet():
    measured = {key: [] for key in measured_where_gpusession_gives(1.0)}
    assert scaling.rows(measured, steps=STEPS) == []
