"""Sweeps without a workflow: search spaces, the successive-halving schedule, promotion, continuation."""

from __future__ import annotations

import copy

import pytest
import torch

from esol.config import TrainConfig
from esol.train import train_model
from snakedvc.config import ConfigError, load_schema, validate_config
from snakedvc.sweep import Rung, SweepPlan, build_trials, expand_space, promote, schedule, total_epochs
from snakedvc.torch.checkpoint import load_state, save_state
from tests.conftest import SCHEMA
from tests.test_train import esol_features  # noqa: F401 - fixture

SCHEMA_DICT = load_schema(SCHEMA)


def sweep_config(**sweep: object) -> dict:
    return validate_config({"sweep": {"enabled": True, **sweep}}, SCHEMA_DICT)


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
    with pytest.raises(ConfigError, match="sweep.min_epochs"):
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
        ({"train.lr": [1, 2, 3], "train.seed": [1, 2, 3]}, "grid", "sweep.max_trials.*9 trials"),
        ({"train.lr": {"low": 0.1, "high": 1}}, "grid", "sweep.space.train.lr.*list"),
        ({"train.max_epochs": [1, 2]}, "grid", "sweep.space.train.max_epochs.*set by the sweep"),
        ({"split.seed": [1, 2]}, "grid", "sweep.space.split.seed"),
        ({}, "grid", "sweep.space.*empty"),
        ({"train.lr": {"low": 0, "high": 1, "log": True}}, "random", "sweep.space.train.lr"),
    ],
)
def test_bad_spaces_name_the_key(space: dict, method: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        expand_space(space, method, 8, 0)


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
    config = sweep_config(space={"train.dropout": [0.1, 1.5], "train.lr": [0.01]})
    trials = build_trials(config, SCHEMA_DICT)
    assert [t.id for t in trials] == ["t000", "t001"]
    assert trials[0].valid and trials[0].config["train"]["dropout"] == 0.1
    assert not trials[1].valid
    assert "train.dropout" in trials[1].error and "1.5" in trials[1].error


def test_rungs_are_sized_for_the_valid_trials_and_an_all_invalid_sweep_is_refused() -> None:
    config = sweep_config(space={"train.dropout": [0.1, 0.2, 1.5, 2.0]}, min_epochs=1)
    config["train"]["max_epochs"] = 4
    plan = SweepPlan.from_config(config, SCHEMA_DICT)
    assert [t.id for t in plan.valid_trials] == ["t000", "t001"]
    assert [(r.epochs, r.size) for r in plan.rungs] == [(1, 2), (2, 1), (4, 1)]
    config = sweep_config(space={"train.dropout": [1.5, 2.0]})
    with pytest.raises(ConfigError, match="every trial is invalid.*train.dropout"):
        SweepPlan.from_config(config, SCHEMA_DICT)


def test_plan_gives_each_rung_its_epochs_and_features_only_where_they_differ() -> None:
    config = sweep_config(space={"featurise.radius": [2, 3], "train.lr": [0.01]}, min_epochs=2)
    config["train"]["max_epochs"] = 8
    plan = SweepPlan.from_config(config, SCHEMA_DICT)
    assert [(r.epochs, r.size) for r in plan.rungs] == [(2, 2), (4, 1), (8, 1)]
    assert plan.features_key("t000") is None  # radius 2 is the workflow's own featurisation
    key = plan.features_key("t001")
    assert key is not None and plan.featurise_by_key()[key]["radius"] == 3
    assert plan.train_section("t000", 1)["max_epochs"] == 4
    assert plan.train_section("t000", 1)["lr"] == 0.01
    assert plan.keep_after(0) == 1 and plan.keep_after(2) == 1


def test_promotion_ranks_by_validation_and_excludes_failures() -> None:
    results = {
        "t000": {"status": "ok", "valid_rmse": 1.2},
        "t001": {"status": "failed", "error": "training diverged"},
        "t002": {"status": "ok", "valid_rmse": 0.9},
        "t003": {"status": "ok", "valid_rmse": 1.2},
    }
    decision = promote(results, keep=2)
    assert decision["ranking"] == ["t002", "t000", "t003"]
    assert decision["survivors"] == ["t002", "t000"]
    assert decision["failed"] == ["t001"]


def test_continuing_a_short_run_equals_one_long_run(esol_features, tmp_path) -> None:  # noqa: F811
    cfg = TrainConfig(hidden_sizes=(32,), max_epochs=6, patience=100, batch_size=32, seed=3, checkpoint_every=0)
    straight = train_model(esol_features["train"], esol_features["valid"], cfg)
    short = train_model(
        esol_features["train"], esol_features["valid"], TrainConfig(**{**cfg.__dict__, "max_epochs": 2})
    )
    assert short.epochs_trained == 2
    state_file = save_state(short.final_state, tmp_path / "state.pt")
    state = load_state(state_file)
    rest = train_model(esol_features["train"], esol_features["valid"], cfg, initial=copy.deepcopy(state))
    assert rest.epochs_trained == 4
    assert rest.history.equals(straight.history)
    for name, tensor in straight.model.state_dict().items():
        assert torch.equal(tensor, rest.model.state_dict()[name]), name
    assert state["epoch"] == 3  # the next epoch to train


def test_load_state_names_a_file_that_is_not_a_state(tmp_path) -> None:
    bad = tmp_path / "state.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="state.pt"):
        load_state(bad)
