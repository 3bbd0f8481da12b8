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
