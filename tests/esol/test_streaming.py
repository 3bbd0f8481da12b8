"""ESOL training streamed from its featurise shards (config loading.stream): the same weights as in
memory, a stop mid-epoch resumed bit for bit, a bad shard named before training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from esol.cli import main as esol_main
from esol.config import FeaturiseConfig, SplitConfig, TrainConfig
from esol.data import read_molecules, split_molecules, write_split
from esol.features import featurise_file, load_features
from esol.streaming import streamed_features
from esol.train import train_model
from snakedvc.torch import Resumable
from tests.conftest import REPO, StopAfter
from tests.esol.configs import config_of

pytestmark = pytest.mark.usefixtures("own_signal_handlers")
SMALL = config_of(TrainConfig, hidden_sizes=(64,), max_epochs=4, patience=100, batch_size=32, seed=7)
FEATURES = config_of(FeaturiseConfig, n_bits=512)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, list[Path]]:
    """Each split featurised as 3 stored shards, and whole (the in-memory path's file)."""
    folder = tmp_path_factory.mktemp("features")
    table = read_molecules(REPO / "data/raw/esol.csv", "smiles", "measured log solubility in mols per litre", 300)
    parts = split_molecules(table, config_of(SplitConfig, seed=0))
    found = {}
    for name, part in parts.items():
        write_split(part, folder / f"{name}.csv")
        featurise_file(folder / f"{name}.csv", folder / f"{name}.npz", folder / f"{name}.rejects.csv", FEATURES)
        found[name] = []
        for shard in range(3):
            path = folder / f"{name}-{shard}.npz"
            featurise_file(folder / f"{name}.csv", path, folder / "r.csv", FEATURES, shard, 3, stored=True)
            found[name].append(path)
    return found


def test_streaming_the_shards_trains_the_weights_loading_the_split_does(shards) -> None:
    whole = train_model(load_features(shards["train"][0].with_name("train.npz")),
                        load_features(shards["valid"][0].with_name("valid.npz")), SMALL)  # fmt: skip
    streamed = train_model(
        streamed_features(shards["train"], SMALL.seed), streamed_features(shards["valid"], SMALL.seed), SMALL
    )
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(tensor, streamed.model.state_dict()[name]), name
    assert whole.meta == streamed.meta
    assert whole.history.equals(streamed.history)


def test_a_stop_mid_epoch_resumes_at_the_next_batch_bit_for_bit(shards, tmp_path: Path) -> None:
    def run(stop: StopAfter) -> object:
        resume = Resumable({"run": 1}, root=tmp_path / "ckpt", inputs=[str(p) for p in shards["train"]], stop=stop)
        return train_model(
            streamed_features(shards["train"], SMALL.seed), streamed_features(shards["valid"], SMALL.seed), SMALL,
            resume=resume,
        )  # fmt: skip

    reference = train_model(
        streamed_features(shards["train"], SMALL.seed), streamed_features(shards["valid"], SMALL.seed), SMALL
    )
    with pytest.raises(SystemExit) as stopped:  # TrainingStopped: 240 rows, 8 steps an epoch: epoch 2 step 2
        run(StopAfter(10))
    assert stopped.value.code == 75 and "at epoch 2 step 2" in str(stopped.value)
    resumed = run(StopAfter(10_000))
    for name, tensor in reference.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name


def test_a_missing_or_cut_shard_is_named_before_training(shards, tmp_path: Path, capsys) -> None:
    cut = tmp_path / "cut.npz"
    cut.write_bytes(shards["train"][1].read_bytes()[:-200])
    args = ["train", "--params", json.dumps({**SMALL.__dict__, "hidden_sizes": [64]}), "--stream",
            "--valid", *map(str, shards["valid"]), "--model", str(tmp_path / "m.pt"), "--live", str(tmp_path / "live"),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--train"]  # fmt: skip
    assert esol_main([*args, str(shards["train"][0]), str(cut)]) == 1
    assert f"shard {cut}: not a readable .npz" in capsys.readouterr().err
    assert esol_main([*args, str(shards["train"][0]), str(tmp_path / "gone.npz")]) == 1
    assert f"shard {tmp_path / 'gone.npz'}: no such file" in capsys.readouterr().err
    # A features file written compressed (before loading.stream was set) says how to write it.
    assert esol_main([*args, str(shards["train"][0].with_name("train.npz"))]) == 1
    assert "is compressed; streaming reads arrays in place" in capsys.readouterr().err
    assert not (tmp_path / "live").exists() or not list((tmp_path / "live").rglob("*.tsv"))
