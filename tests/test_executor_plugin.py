"""The profile's executor: the official SLURM plugin, subclassed only to bound the status-check interval."""

from __future__ import annotations

import yaml

from tests.conftest import REPO


def test_profile_executor_is_the_official_plugin_with_a_bounded_status_interval() -> None:
    import snakemake_executor_plugin_slurm as official
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    from snakemake_executor_plugin_snakedvc_slurm import bounded_interval

    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    plugin = ExecutorPluginRegistry().get_plugin(profile["executor"])
    assert issubclass(plugin.executor, official.Executor)
    assert issubclass(plugin._executor_settings_cls, official.ExecutorSettings)
    cap = profile["snakedvc-slurm-max-seconds-between-status-checks"]
    # The official plugin's growth (+10 s per idle round, up to 180 s) is cut at the cap.
    assert [bounded_interval(s, cap) for s in (2, 12, 180)] == [2, cap, cap]
    assert bounded_interval(None, cap) is None
    # Every setting in the profile names a real setting of the plugin (a typo would be ignored otherwise).
    fields = {f"snakedvc-slurm-{f.replace('_', '-')}" for f in plugin._executor_settings_cls.__dataclass_fields__}
    assert {k for k in profile if k.startswith("snakedvc-slurm-")} <= fields


class RecordingClock:
    def __init__(self) -> None:
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    def time(self) -> float:
        return 42.0


def test_plugin_clock_shortens_only_the_fixed_pause_before_sbatch() -> None:
    from snakemake_executor_plugin_snakedvc_slurm import PLUGIN_SUBMIT_PAUSE, PluginClock

    recorded = RecordingClock()
    clock = PluginClock(0.0, clock=recorded)
    clock.sleep(PLUGIN_SUBMIT_PAUSE)
    clock.sleep(2)  # any other wait is the plugin's own business
    assert recorded.slept == [0.0, 2]
    assert clock.time() == 42.0  # everything else is the real clock


def test_run_job_submits_through_the_official_code_with_the_pause_bounded_then_restores_it(monkeypatch) -> None:
    import time
    from types import SimpleNamespace

    import snakemake_executor_plugin_slurm as official

    from snakemake_executor_plugin_snakedvc_slurm import Executor, PluginClock

    seen = []

    def official_run_job(self, job) -> None:  # what plugin 2.6.1 does first in run_job
        seen.append((job, official.time))
        official.time.sleep(5)

    monkeypatch.setattr(official.Executor, "run_job", official_run_job)
    executor = Executor.__new__(Executor)
    executor.workflow = SimpleNamespace(executor_settings=SimpleNamespace(submit_delay_seconds=0.0))
    executor.run_job("job-1")
    assert seen[0][0] == "job-1" and isinstance(seen[0][1], PluginClock) and seen[0][1].delay == 0.0
    assert official.time is time  # restored for everyone else
