"""Featurisation at scale: the fast ECFP path against molflux, streaming, shards and their gather."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from benchlib import rdkit_smiles

from esol.arrays import NpzWriter, iter_array_chunks, load_arrays, save_arrays
from esol.config import FeaturiseConfig
from esol.features import (
    TooManyRejectsError,
    featurise_chunk,
    featurise_file,
    featurise_table,
    gather_features,
    load_features,
    shard_bounds,
)
from tests.conftest import md5
from tests.esol.configs import config_of
from tests.esol.test_features import MOLECULES

# Stereo, charges, aromatic heterocycles, isotopes, salts, radicals, a macrocycle, organometallics.
EDGE_CASES = [
    *MOLECULES,
    "C[C@@H]1CC[C@H](O)CC1",
    "N[C@@H](Cc1c[nH]c2ccccc12)C(=O)O",
    "C/C=C/C=C\\C",
    "[O-][N+](=O)c1ccc(cc1)[N+]([O-])=O",
    "C[N+](C)(C)C",
    "[O-]S(=O)(=O)[O-].[Mg+2]",
    "c1ccc2[nH]ccc2c1",
    "c1cnc2ncnc2c1",
    "o1cccc1",
    "[2H]C([2H])([2H])O",
    "[CH3]",
    "C1CCCCCCCCCCCCCCCCCCCCC1",
    "[Cu+2].[O-]C(=O)C.[O-]C(=O)C",
]


def write_split(path: Path, smiles: list[str]) -> Path:
    table = pd.DataFrame({"row": np.arange(len(smiles)), "smiles": smiles, "y": np.linspace(-5, 1, len(smiles))})
    table.to_csv(path, index=False)
    return path


def test_fast_ecfp_path_is_bit_identical_to_molflux_on_15000_molecules() -> None:
    smiles = rdkit_smiles() + EDGE_CASES
    assert len(smiles) >= 10_000
    table = pd.DataFrame({"row": np.arange(len(smiles)), "smiles": smiles, "y": 0.0})
    for radius, n_bits in [(2, 2048), (3, 1024)]:
        fast = featurise_chunk(table, config_of(FeaturiseConfig, radius=radius, n_bits=n_bits, engine="auto"))
        slow = featurise_chunk(table, config_of(FeaturiseConfig, radius=radius, n_bits=n_bits, engine="molflux"))
        assert len(fast.rows) > 0.99 * len(smiles)
        np.testing.assert_array_equal(fast.rows, slow.rows)
        assert fast.X.dtype == np.uint8 and fast.X.shape == (len(fast.rows), n_bits // 8)
        assert np.array_equal(fast.X, slow.X), f"fast path differs from molflux at radius {radius}"
        pd.testing.assert_frame_equal(fast.rejects, slow.rejects)
        assert fast.X.any(axis=1).all()  # every molecule sets bits: nothing silently empty


def test_shard_bounds_are_contiguous_balanced_and_cover_every_row() -> None:
    for n in (0, 1, 7, 100, 1001):
        for shards in (1, 2, 3, 8, 13):
            bounds = [shard_bounds(n, i, shards) for i in range(shards)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
            sizes = [stop - start for start, stop in bounds]
            assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="shard 3 is not in 0..2"):
        shard_bounds(10, 3, 3)


def shard_and_gather(tmp_path: Path, split: Path, cfg: FeaturiseConfig, shards: int, chunk_size: int) -> Path:
    out = tmp_path / f"k{shards}-c{chunk_size}"
    out.mkdir()
    features, rejects = [], []
    for i in range(shards):
        features.append(out / f"{i}.npz")
        rejects.append(out / f"{i}.rejects.csv")
        featurise_file(split, features[-1], rejects[-1], cfg, i, shards, chunk_size)
    gather_features(features, rejects, out / "all.npz", out / "all.rejects.csv", cfg, where=str(split))
    return out


@pytest.mark.parametrize("representation", ["morgan", "maccs_rdkit"])
def test_any_number_of_shards_and_any_chunk_size_give_the_same_bytes(tmp_path: Path, representation: str) -> None:
    smiles = rdkit_smiles()[:300]
    smiles[17] = "C1CC(bad"  # rejects land in one shard; their rows stay in order
    smiles[250] = "c1cccc1"
    split = write_split(tmp_path / "split.csv", smiles)
    cfg = config_of(FeaturiseConfig, representation=representation, max_reject_fraction=0.05)
    runs = [shard_and_gather(tmp_path, split, cfg, k, c) for k, c in [(1, 10_000), (3, 10_000), (8, 7), (1, 1)]]
    assert len({md5(r / "all.npz") for r in runs}) == 1
    assert len({md5(r / "all.rejects.csv") for r in runs}) == 1
    # ...and the same as featurising the whole table in memory.
    whole, rejects = featurise_table(pd.read_csv(split, keep_default_na=False), cfg)
    gathered = load_features(runs[1] / "all.npz")
    np.testing.assert_array_equal(gathered.rows, whole.rows)
    np.testing.assert_array_equal(gathered.X, whole.X)
    assert pd.read_csv(runs[1] / "all.rejects.csv")["row"].tolist() == [17, 250] == rejects["row"].tolist()


def test_descriptor_shards_gather_like_one_run(tmp_path: Path) -> None:
    split = write_split(tmp_path / "split.csv", rdkit_smiles()[:40])
    cfg = config_of(FeaturiseConfig, representation="rdkit_descriptors_2d")
    one, three = (shard_and_gather(tmp_path, split, cfg, k, 6) for k in (1, 3))
    assert md5(one / "all.npz") == md5(three / "all.npz")
    features = load_features(three / "all.npz")
    assert features.X.shape[0] == 40 and features.X.shape[1] > 100 and features.X.dtype == np.float32


def test_gather_fails_on_too_many_rejects_in_total_and_writes_nothing(tmp_path: Path) -> None:
    smiles = rdkit_smiles()[:100]
    for i in (3, 40, 77):  # 3 % in all, spread over the shards
        smiles[i] = "not a smiles"
    split = write_split(tmp_path / "split.csv", smiles)
    cfg = config_of(FeaturiseConfig, max_reject_fraction=0.02)
    with pytest.raises(TooManyRejectsError, match=r"split.csv: 3 of 100 SMILES .*max_reject_fraction=0.02"):
        shard_and_gather(tmp_path, split, cfg, 3, 50)
    assert not (tmp_path / "k3-c50" / "all.npz").exists()
    assert not list((tmp_path / "k3-c50").glob(".all.npz*"))  # no temp left behind


def test_npz_writer_streams_round_trips_and_refuses_mixed_chunks(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    X = rng.integers(0, 255, size=(1000, 32), dtype=np.uint8)
    with NpzWriter(tmp_path / "a.npz") as writer:
        for start in range(0, 1000, 333):
            writer.append("X", X[start : start + 333])
        writer.scalar("n", 1000)
    save_arrays(tmp_path / "b.npz", X=X, n=np.array(1000))
    assert md5(tmp_path / "a.npz") == md5(tmp_path / "b.npz")
    loaded = load_arrays(tmp_path / "a.npz")
    np.testing.assert_array_equal(loaded["X"], X)
    assert loaded["n"].shape == () and int(loaded["n"]) == 1000
    chunks = list(iter_array_chunks(tmp_path / "a.npz", "X", max_bytes=32 * 100))
    assert [len(c) for c in chunks] == [100] * 10
    np.testing.assert_array_equal(np.concatenate(chunks), X)
    with pytest.raises(ValueError, match="'X' chunk is float32"), NpzWriter(tmp_path / "c.npz") as writer:
        writer.append("X", X[:5])
        writer.append("X", X[:5].astype(np.float32))
    assert not (tmp_path / "c.npz").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz", "b.npz"]  # no temp files left
