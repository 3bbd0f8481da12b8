"""Sweeps without a workflow: search spaces, the successive-halving schedule, promotion, continuation."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from snakedvc.engine.config import ConfigError, load_schema, validate_config
from snakedvc.engine.settings import settings
from snakedvc.engine.sweep import SweepPlan
from snakedvc.engine.sweep.plan import PUBLIC, Rung, schedule, total_epochs
from snakedvc.engine.sweep.promotion import promote, read_trial_metrics
from snakedvc.engine.sweep.space import build_trials, expand_space, user_config
from snakedvc.engine.workflow import kit_schema
from snakedvc.torch.checkpoint import load_state
from tests.conftest import REPO, SCHEMA

SCHEMA_DICT = load_schema(SCHEMA)
ESOL_CONFIG = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def sweep_config(**sweep: object) -> dict:
    """ESOL's config as snakedvc.configure leaves it, with the sweep enabled and these settings."""
    user = validate_config({k: v for k, v in ESOL_CONFIG.items() if k != "snakedvc"}, SCHEMA_DICT)
    kit = copy.deepcopy(ESOL_CONFIG["snakedvc"])
    kit["schema"] = str(SCHEMA)
    kit["sweep"].update(enabled=True, **sweep)
    return {**user, "snakedvc": validate_config(kit, kit_schema())}


def trials_of(config: dict) -> list:
    return build_trials(settings(config).sweep, user_config(config), SCHEMA_DICT)


def epochs_by_simulation(n_trials: int, rungs: list[Rung]) -> int:
    """Every trial ends at the epochs of the last rung it reached: the total, counted per trial."""
    reached = [0] * n_trials
    for rung in rungs:
        for trial in range(rung.size):  # which trials survive does not matter for the count
            reached[trial] = rung.epochs
    return sum(reached)


def test_successive_halving_schedule_and_its_epochs() -> None:
    rungs = schedule(8, "successive_halving", min_epochs=6, eta=2, max_epochs=48)
    assert [(r.epochs, r.size) for r in rungs] == [(6, 8), (12, 4), (24, 2), (48, 1)]
    assert total_epochs(rungs) == epochs_by_simulation(8, rungs) == 120
    full = schedule(8, "full", min_epochs=6, eta=2, max_epochs=48)
    assert total_epochs(full) == 8 * 48
    assert total_epochs(rungs) / total_epochs(full) <= 0.4


@pytest.mark.parametrize(
    ("n", "min_epochs", "eta", "max_epochs"), [(9, 1, 3, 10), (5, 2, 2, 7), (27, 1, 3, 27), (3, 4, 2, 4), (8, 1, 2, 4)]
)
def test_schedule_total_matches_a_per_trial_count(n: int, min_epochs: int, eta: int, max_epochs: int) -> None:
    rungs = schedule(n, "successive_halving", min_epochs, eta, max_epochs)
    assert rungs[0].epochs == min_epochs and rungs[0].size == n
    assert rungs[-1].epochs == max_epochs
    assert all(a.epochs < b.epochs and a.size >= b.size >= 1 for a, b in zip(rungs, rungs[1:], strict=False))
    assert total_epochs(rungs) == epochs_by_simulation(n, rungs)


def test_schedule_rejects_min_epochs_above_the_budget() -> None:
    with pytest.raises(ConfigError, match="snakedvc.sweep.min_epochs"):
        schedule(4, "successive_halving", min_epochs=10, eta=2, max_epochs=5)


def test_grid_is_every_combination_in_order() -> None:
    grid = expand_space({"train.lr": [0.1, 0.2], "train.hidden_sizes": [[8], [16, 4]]}, "grid", 8, 0)
    assert grid == [
        {"train.lr": 0.1, "train.hidden_sizes": [8]},
        {"train.lr": 0.1, "train.hidden_sizes": [16, 4]},
        {"train.lr": 0.2, "train.hidden_sizes": [8]},
        {"train.lr": 0.2, "train.hidden_sizes": [16, 4]},
    ]


@pytest.mark.parametrize(
    ("space", "method", "message"),
    [
        ({"train.lr": [1, 2, 3], "train.seed": [1, 2, 3]}, "grid", "snakedvc.sweep.max_trials.*9 trials"),
        ({"train.lr": {"low": 0.1, "high": 1}}, "grid", "snakedvc.sweep.space.train.lr.*list"),
        ({"train.max_epochs": [1, 2]}, "grid", "space.train.max_epochs.*budget key.*not searchable"),
        ({"split.seed": [1, 2]}, "grid", "space.split.seed.*not searchable; snakedvc.sweep.searchable allows"),
        ({"train.lrr": [1, 2]}, "grid", r"space.train.lrr.*no such key \(did you mean train.lr\?\)"),
        ({"snakedvc.tracking": [True, False]}, "grid", "kit's own settings"),
        ({}, "grid", "snakedvc.sweep.space.*empty"),
        ({"train.lr": {"low": 0, "high": 1, "log": True}}, "random", "snakedvc.sweep.space.train.lr"),
    ],
)
def test_bad_spaces_name_the_key(space: dict, method: str, message: str) -> None:
    config = sweep_config(space=space, method=method)
    with pytest.raises(ConfigError, match=message):
        trials_of(config)


def test_any_key_of_any_depth_is_searchable_when_the_workflow_allows_it() -> None:
    # A workflow that is not ESOL: no schema, a nested key, accuracy to maximise.
    config = {
        "model": {"net": {"width": 8}, "epochs": 4},
        "snakedvc": validate_config(
            {"sweep": {"enabled": True, "metric": "accuracy", "direction": "max", "budget": "model.epochs",
                       "space": {"model.net.width": [8, 16]}, "min_epochs": 1}},
            kit_schema(),
        ),
    }  # fmt: skip
    plan = SweepPlan._from_config(config)
    assert [t.config["model"]["net"]["width"] for t in plan._trials] == [8, 16]
    assert [(r.epochs, r.size) for r in plan._rungs] == [(1, 2), (2, 1), (4, 1)]
    assert plan._trial_config("t001", 0) == {"model": {"net": {"width": 16}, "epochs": 1}}


@pytest.mark.parametrize("missing", ["metric", "budget"])
def test_an_enabled_sweep_needs_its_metric_and_budget(missing: str) -> None:
    config = sweep_config(space={"train.lr": [0.1]})
    config["snakedvc"]["sweep"][missing] = ""
    with pytest.raises(ConfigError, match=f"snakedvc.sweep.{missing}.*required"):
        SweepPlan._from_config(config)


def test_random_draws_are_seeded_and_in_range() -> None:
    space = {
        "train.lr": {"low": 1e-4, "high": 1e-2, "log": True},
        "train.batch_size": [16, 32, 64],
        "train.seed": {"low": 0, "high": 9},
    }
    a = expand_space(space, "random", 20, seed=3)
    assert a == expand_space(space, "random", 20, seed=3)
    assert a != expand_space(space, "random", 20, seed=4)
    assert len(a) == 20
    assert all(1e-4 <= t["train.lr"] <= 1e-2 for t in a)
    assert all(t["train.batch_size"] in (16, 32, 64) for t in a)
    assert all(isinstance(t["train.seed"], int) and 0 <= t["train.seed"] <= 9 for t in a)
    # Log-uniform: about half the draws below the geometric midpoint 1e-3.
    assert 4 <= sum(t["train.lr"] < 1e-3 for t in a) <= 16


def test_invalid_trial_values_are_reported_per_trial_not_for_the_sweep() -> None:
    # The config carries the kit's own section, as in a workflow: trials are checked without it.
    config = sweep_config(space={"train.dropout": [0.1, 1.5], "train.lr": [0.01]})
    trials = trials_of(config)
    assert [t.id for t in trials] == ["t000", "t001"]
    assert trials[0].valid and trials[0].config["train"]["dropout"] == 0.1
    assert "snakedvc" not in trials[0].config
    assert not trials[1].valid
    assert "train.dropout" in trials[1].error and "1.5" in trials[1].error


def test_rungs_are_sized_for_the_valid_trials_and_an_all_invalid_sweep_is_refused() -> None:
    config = sweep_config(space={"train.dropout": [0.1, 0.2, 1.5, 2.0]}, min_epochs=1)
    config["train"]["max_epochs"] = 4
    plan = SweepPlan._from_config(config)
    assert [t.id for t in plan._valid_trials] == ["t000", "t001"]
    assert [(r.epochs, r.size) for r in plan._rungs] == [(1, 2), (2, 1), (4, 1)]
    config = sweep_config(space={"train.dropout": [1.5, 2.0]})
    with pytest.raises(ConfigError, match="every trial is invalid.*train.dropout"):
        SweepPlan._from_config(config)


def test_plan_gives_each_rung_its_epochs_and_a_section_variant_only_where_it_differs() -> None:
    config = sweep_config(space={"featurise.radius": [2, 3], "train.lr": [0.01]}, min_epochs=2)
    config["train"]["max_epochs"] = 8
    plan = SweepPlan._from_config(config)
    assert [(r.epochs, r.size) for r in plan._rungs] == [(2, 2), (4, 1), (8, 1)]
    assert plan.section_variant("t000", "featurise") is None  # radius 2 is the workflow's own featurisation
    key = plan.section_variant("t001", "featurise")
    assert key is not None and plan.variants("featurise")[key]["radius"] == 3
    assert plan._trial_config("t000", 1)["train"]["max_epochs"] == 4
    assert plan._trial_config("t000", 1)["train"]["lr"] == 0.01
    assert plan._keep_after(0) == 1 and plan._keep_after(2) == 1


def test_trial_rule_helpers_give_the_contract_files_and_quoted_arguments() -> None:
    config = sweep_config(space={"train.lr": [0.01, 0.02]}, dir="it's here", min_epochs=2)
    plan = SweepPlan._from_config(config)
    outputs = plan.outputs(model="model.pt")
    assert outputs["metrics"] == r"it's here/sweep/trials/{trial,t\d+}/rung{rung,\d+}/metrics.json"
    assert outputs["state"].endswith("/state.pt") and outputs["model"].endswith("/model.pt")

    class Wildcards:
        trial, rung = "t001", "1"

    assert plan.previous_state(Wildcards) == ["it's here/sweep/trials/t001/rung0/state.pt"]
    args = plan.trial_args("--resume-from", "--state-out", metrics_flag="--result")(Wildcards)
    assert args == (
        "--state-out 'it'\"'\"'s here/sweep/trials/t001/rung1/state.pt' "
        "--resume-from 'it'\"'\"'s here/sweep/trials/t001/rung0/state.pt' "
        "--result 'it'\"'\"'s here/sweep/trials/t001/rung1/metrics.json'"
    )
    assert '"max_epochs": 4' in plan.section("train")(Wildcards) and '"lr": 0.02' in plan.section("train")(Wildcards)


def test_a_rules_flags_and_trial_args_are_the_trials_in_its_jobs_and_the_configs_elsewhere(
    tmp_path, monkeypatch
) -> None:
    """``snakedvc.flags(config, key)`` and ``SWEEP.trial_args()`` in the plain rule serve the trial
    rule made from it: a trial's job gets the trial's values and states, any other job the config's."""
    from snakedvc.engine.sweep import plan as sweep_plan
    from snakedvc.engine.workflow import flags, targets

    config = sweep_config(space={"train.lr": [0.01, 0.02]}, min_epochs=2)
    plan = sweep_plan(config)
    hp, trial_args = flags(config, "train"), plan.trial_args()

    class Trial:
        trial, rung = "t001", "1"

    class Plain:  # the plain rule's job: no wildcards
        pass

    class Other:  # a job of the user's with wildcards of these names that name no trial of the sweep
        trial, rung = "best", "1"

    assert "--lr 0.02" in hp(Trial) and "--max-epochs 4" in hp(Trial)
    plain = flags(config["train"])
    assert hp(Plain) == plain == hp(Other) and "--lr 0.001" in plain
    assert trial_args(Trial) == (
        f"--final-state {plan.root}/trials/t001/rung1/state.pt --continue-from {plan.root}/trials/t001/rung0/state.pt"
    )
    assert trial_args(Plain) == trial_args(Other) == "" and plan.previous_state(Plain) == []
    monkeypatch.chdir(tmp_path)  # no DVC repository: no records
    assert targets(config, "results/model.pt", track="results/model.pt") == [plan.report]
    (tmp_path / ".dvc").mkdir()
    assert targets(config, "results/model.pt", track="results/model.pt") == [plan.report, f"{plan.report}.dvc"]
    config["snakedvc"]["sweep"]["enabled"] = False
    assert flags(config, "train")(Trial) == plain and sweep_plan(config).trial_args()(Trial) == ""
    assert targets(config, "results/model.pt", "results/metrics.json", track=["results/model.pt"]) == [
        "results/model.pt", "results/metrics.json", "results/model.pt.dvc",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("direction", "ranking"), [("min", ["t002", "t000", "t003"]), ("max", ["t000", "t003", "t002"])]
)
def test_promotion_ranks_by_the_metric_in_its_direction_and_excludes_failures(direction: str, ranking: list) -> None:
    results = {
        "t000": {"status": "ok", "metric": 1.2},
        "t001": {"status": "failed", "error": "training diverged"},
        "t002": {"status": "ok", "metric": 0.9},
        "t003": {"status": "ok", "metric": 1.2},
    }
    decision = promote(results, keep=2, direction=direction)
    assert decision["ranking"] == ranking
    assert decision["survivors"] == ranking[:2]
    assert decision["failed"] == ["t001"]


@pytest.mark.parametrize(
    ("content", "status", "error"),
    [
        ('{"accuracy": 0.9, "loss": 0.1}', "ok", None),
        ('{"error": "training diverged at epoch 3"}', "failed", "training diverged at epoch 3"),
        ('{"loss": 0.1}', "failed", "metric 'accuracy' is None"),
        ('{"accuracy": NaN}', "failed", "metric 'accuracy' is nan"),
        ('{"accuracy": true}', "failed", "metric 'accuracy' is True"),
        ("[0.9]", "failed", "expected a JSON object"),
        ("{", "failed", "unreadable metrics file"),
    ],
)
def test_trial_metrics_file_gives_the_metric_or_why_the_trial_failed(tmp_path, content, status, error) -> None:
    path = tmp_path / "metrics.json"
    path.write_text(content)
    result = read_trial_metrics(path, "accuracy")
    assert result["status"] == status
    if error is None:
        assert result["metric"] == 0.9
    else:
        assert error in result["error"]


def test_load_state_names_a_file_that_is_not_a_state(tmp_path) -> None:
    bad = tmp_path / "state.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="state.pt"):
        load_state(bad)


def test_the_plans_public_members_are_exactly_the_documented_ones() -> None:
    public = {name for name in dir(SweepPlan) if not name.startswith("_")}
    assert public == set(PUBLIC)
    documented = set(re.findall(r"``(\w+)", SweepPlan.__doc__ or ""))
    assert set(PUBLIC) <= documented, set(PUBLIC) - documented


def test_asha_has_the_rungs_of_halving_and_slots_enough_for_one_trial_to_reach_the_last(tmp_path) -> None:
    config = sweep_config(space={"train.lr": [0.001, 0.003, 0.01, 0.03, 0.1]}, min_epochs=1, strategy="asha")
    config["train"]["max_epochs"] = 4
    plan = SweepPlan._from_config(config)
    assert [r.epochs for r in plan._rungs] == [1, 2, 4]
    assert plan._slots == 4  # eta^(rungs - 1), as Determined's default
    config["snakedvc"]["sweep"]["max_concurrent_trials"] = 9
    assert SweepPlan._from_config(config)._slots == 5  # never more slots than trials
    header = SweepPlan._from_config(config)._asha_header()
    # Every valid trial, started in an order drawn with the sweep's seed (the same each time).
    assert sorted(header.trials) == ["t000", "t001", "t002", "t003", "t004"] and header.rungs == (1, 2, 4)
    assert header.trials != tuple(sorted(header.trials)) and header == SweepPlan._from_config(config)._asha_header()
    assert (header.eta, header.slots, header.metric, header.direction) == (2, 5, "valid_rmse", "min")
    assert plan._describe()["strategy"] == "asha" and plan._describe()["slots"] == 4


@pytest.mark.parametrize("key, value", [("max_concurrent_trials", 4), ("replay", "decisions.jsonl")])
def test_asha_keys_are_refused_with_another_strategy_and_a_missing_replay_log_is_named(key: str, value) -> None:
    config = sweep_config(space={"train.lr": [0.01, 0.1]}, **{key: value})
    with pytest.raises(ConfigError, match=f"snakedvc.sweep.{key}': only strategy asha uses it .*successive_halving"):
        SweepPlan._from_config(config)
    config = sweep_config(space={"train.lr": [0.01, 0.1]}, strategy="asha", replay="no/such/decisions.jsonl")
    with pytest.raises(ConfigError, match="snakedvc.sweep.replay': no file no/such/decisions.jsonl"):
        SweepPlan._from_config(config)


def test_a_trials_folder_output_stays_a_folder() -> None:
    """``SWEEP.outputs(live=directory("live"))``: the trial's own dvclive folder, still a directory()
    output (a stranger's trials failed with Snakemake's "Outputs of incorrect type" when the flag was lost)."""
    from snakemake.io import directory, is_flagged, temp

    from snakedvc.engine.sweep import plan as sweep_plan

    plan = sweep_plan(sweep_config(space={"train.lr": [0.01, 0.02]}, min_epochs=2))
    outputs = plan.outputs(model="model.pt", live=directory("live"), scratch=temp("scratch.bin"))
    assert outputs["live"] == plan.trial_file("live") and is_flagged(outputs["live"], "directory")
    assert is_flagged(outputs["scratch"], "temp") and not is_flagged(outputs["scratch"], "directory")
    assert outputs["model"] == plan.trial_file("model.pt") and not is_flagged(outputs["model"], "directory")
