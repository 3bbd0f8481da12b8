from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from esol.config import FeaturiseConfig, SplitConfig, TrainConfig
from esol.data import read_molecules, split_molecules
from esol.evaluate import predict, regression_metrics
from esol.features import FeatureSet, featurise_table
from esol.model import load_model, save_model
from esol.train import epoch_order, train_model
from snakedvc.live import EpochLog
from snakedvc.torch.checkpoint import load_state, save_state
from tests.conftest import REPO
from tests.esol.configs import config_of

SMALL = config_of(TrainConfig, hidden_sizes=(64,), max_epochs=8, patience=100, batch_size=32, seed=7)


@pytest.fixture(scope="module")
def esol_features() -> dict[str, FeatureSet]:
    table = read_molecules(REPO / "data/raw/esol.csv", "smiles", "measured log solubility in mols per litre", 300)
    parts = split_molecules(table, config_of(SplitConfig, seed=0))
    cfg = config_of(FeaturiseConfig, n_bits=512)
    return {name: featurise_table(part, cfg)[0] for name, part in parts.items()}


def test_same_config_gives_bitwise_identical_weights(esol_features, tmp_path: Path) -> None:
    a = train_model(esol_features["train"], esol_features["valid"], SMALL, live=EpochLog(tmp_path / "a"))
    b = train_model(esol_features["train"], esol_features["valid"], SMALL, live=EpochLog(tmp_path / "b"))
    for name, tensor in a.model.state_dict().items():
        assert torch.equal(tensor, b.model.state_dict()[name]), name
    save_model(tmp_path / "a.pt", a.model, a.meta)
    save_model(tmp_path / "b.pt", b.model, b.meta)
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()
    # dvclive's per-epoch files too: the same numbers, written the same way.
    curves = [sorted((p.name, p.read_bytes()) for p in (tmp_path / run).rglob("*.tsv")) for run in "ab"]
    assert curves[0] == curves[1] and len(curves[0]) == 3


def test_different_seed_gives_different_weights(esol_features) -> None:
    a = train_model(esol_features["train"], esol_features["valid"], SMALL)
    b = train_model(esol_features["train"], esol_features["valid"], TrainConfig(**{**SMALL.__dict__, "seed": 8}))
    assert not torch.equal(a.model.hidden[0].weight, b.model.hidden[0].weight)


def test_training_loss_decreases(esol_features) -> None:
    result = train_model(esol_features["train"], esol_features["valid"], SMALL)
    losses = result.history["train_loss"].tolist()
    assert len(losses) == SMALL.max_epochs
    assert losses[-1] < 0.5 * losses[0]
    assert result.history["valid_loss"].min() < result.history["valid_loss"].iloc[0]


def test_early_stopping_keeps_best_epoch(esol_features) -> None:
    cfg = config_of(TrainConfig, hidden_sizes=(64,), max_epochs=60, patience=3, seed=1)
    result = train_model(esol_features["train"], esol_features["valid"], cfg)
    history = result.history
    assert len(history) < 60
    assert result.best_epoch == int(history.loc[history["valid_loss"].idxmin(), "epoch"])
    assert len(history) == result.best_epoch + 3


def test_saved_model_predicts_like_trained_one(esol_features, tmp_path: Path) -> None:
    result = train_model(esol_features["train"], esol_features["valid"], SMALL)
    save_model(tmp_path / "m.pt", result.model, result.meta)
    model, meta = load_model(tmp_path / "m.pt")
    test = esol_features["test"]
    expected = predict(result.model, result.meta, test.X)
    assert (predict(model, meta, test.X) == expected).all()
    assert regression_metrics(test.y, expected)["rmse"] < 2.5


def test_epoch_order_is_a_pure_function() -> None:
    assert torch.equal(epoch_order(50, 1, 3), epoch_order(50, 1, 3))
    assert not torch.equal(epoch_order(50, 1, 3), epoch_order(50, 1, 4))
    assert sorted(epoch_order(50, 1, 3).tolist()) == list(range(50))


def test_divergence_is_a_clear_error(esol_features) -> None:
    from esol.train import TrainingDivergedError

    with pytest.raises(TrainingDivergedError, match="train.lr"):
        train_model(esol_features["train"], esol_features["valid"], config_of(TrainConfig, hidden_sizes=(32,), lr=1e30))


def test_descriptor_features_are_standardised_in_training_and_in_prediction(tmp_path: Path) -> None:
    table = read_molecules(REPO / "data/raw/esol.csv", "smiles", "measured log solubility in mols per litre", 200)
    parts = split_molecules(table, config_of(SplitConfig, seed=0))
    cfg = config_of(FeaturiseConfig, representation="rdkit_descriptors_2d")
    feats = {name: featurise_table(part, cfg)[0] for name, part in parts.items()}
    result = train_model(feats["train"], feats["valid"], SMALL)
    x_mean = result.meta["x_mean"].numpy()
    finite = np.where(np.isfinite(feats["train"].X), feats["train"].X, np.nan).astype(np.float64)
    np.testing.assert_allclose(x_mean, np.nan_to_num(np.nanmean(finite, axis=0)))
    save_model(tmp_path / "m.pt", result.model, result.meta)
    model, meta = load_model(tmp_path / "m.pt")
    raw = predict(model, meta, feats["test"].X)
    assert np.array_equal(raw, predict(result.model, result.meta, feats["test"].X))
    # Without the stored standardisation the same weights predict something else entirely.
    unscaled = predict(model, {k: v for k, v in meta.items() if k not in ("x_mean", "x_std")}, feats["test"].X)
    assert not np.allclose(raw, unscaled)
    assert regression_metrics(feats["test"].y, raw)["rmse"] < 1.5


def test_fingerprint_models_carry_no_feature_scaling(esol_features) -> None:
    result = train_model(esol_features["train"], esol_features["valid"], SMALL)
    assert "x_mean" not in result.meta


# A sweep trial continues its previous rung's state (snakedvc.torch's save_state / load_state).
def test_continuing_a_short_run_equals_one_long_run(esol_features, tmp_path) -> None:
    cfg = config_of(
        TrainConfig, hidden_sizes=(32,), max_epochs=6, patience=100, batch_size=32, seed=3, checkpoint_every=0
    )
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
