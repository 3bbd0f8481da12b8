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
    # The interval the official generator sets is what our override bounds: the attribute exists
    # in the real plugin (a rename upstream would leave the cap silently unapplied).
    import inspect

    assert "self.next_seconds_between_status_checks" in inspect.getsource(official.Executor.check_active_jobs)
    cap = profile["snakedvc-slurm-max-seconds-between-status-checks"]
    assert bounded_interval(180, cap) == cap and bounded_interval(None, cap) is None
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


def test_the_pause_the_clock_shortens_is_the_real_plugins_pause_before_sbatch() -> None:
    """Against the installed plugin's own code, not a stand-in: its run_job sleeps exactly
    PLUGIN_SUBMIT_PAUSE seconds through the module-level `time`, before it calls sbatch. If
    upstream moves or changes that pause, this fails instead of the patch silently missing it."""
    import inspect

    import snakemake_executor_plugin_slurm as official

    from snakemake_executor_plugin_snakedvc_slurm import PLUGIN_SUBMIT_PAUSE

    source = inspect.getsource(official.Executor.run_job)
    pause = source.index(f"time.sleep({PLUGIN_SUBMIT_PAUSE})")
    assert pause < source.index("subprocess.Popen(")  # before the sbatch call
    assert official.time.__name__ == "time"  # the module our context manager swaps, unswapped now
