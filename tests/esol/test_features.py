from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from esol.config import FeaturiseConfig
from esol.features import (
    TooManyRejectsError,
    apply_scaling,
    check_reject_fraction,
    check_smiles,
    featurise_smiles,
    featurise_table,
    fit_scaling,
    load_features,
    save_features,
)
from tests.esol.configs import config_of, defaults

# Aromatic, charged, stereo, isotopes, salts, macrocycles, a lone atom.
MOLECULES = [
    "CCO",
    "c1ccccc1O",
    "C[C@H](N)C(=O)O",
    "C[C@@H](N)C(=O)O",
    "F/C=C/F",
    "F/C=C\\F",
    "[NH4+].[Cl-]",
    "CC(=O)[O-].[Na+]",
    "[13CH4]",
    "c1ccc2c(c1)[nH]c1ccccc12",
    "O=C1CCCCCCCCCCCCCCCCC1",
    "[Fe+2]",
    "OCC3OC(OCC2OC(OC(C#N)c1ccccc1)C(O)C(O)C2O)C(O)C(O)C3O",
]


def rdkit_bits(smiles: list[str], radius: int, n_bits: int) -> np.ndarray:
    from rdkit import Chem
    from rdkit.Chem import rdFingerprintGenerator

    generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)
    return np.array([generator.GetFingerprintAsNumPy(Chem.MolFromSmiles(s)) for s in smiles], dtype=np.float32)


def table(smiles: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"row": np.arange(len(smiles)), "smiles": smiles, "y": np.linspace(0, 1, len(smiles))})


@pytest.mark.parametrize(("radius", "n_bits"), [(2, 2048), (3, 1024), (2, 1000), (2, 4096)])
def test_molflux_morgan_bits_equal_rdkit_morgan_generator(radius: int, n_bits: int) -> None:
    features, rejects = featurise_table(table(MOLECULES), config_of(FeaturiseConfig, radius=radius, n_bits=n_bits))
    assert rejects.empty
    np.testing.assert_array_equal(features.X, rdkit_bits(MOLECULES, radius, n_bits))


def test_radius_is_passed_to_molflux() -> None:
    r1, _ = featurise_table(table(MOLECULES), config_of(FeaturiseConfig, radius=1))
    r2, _ = featurise_table(table(MOLECULES), config_of(FeaturiseConfig, radius=2))
    assert r1.X.sum() < r2.X.sum()


@pytest.mark.parametrize(
    ("smiles", "reason"),
    [
        ("C1CC", "unclosed ring"),
        ("c1cccc1", "Kekulize"),
        ("CC(C)(C)(C)C", "valence"),
        ("", "empty"),
        ("not a molecule", "unparsable"),
    ],
)
def test_check_smiles_reasons(smiles: str, reason: str) -> None:
    result = check_smiles(smiles)
    assert result is not None and reason.lower() in result.lower()


def test_invalid_smiles_go_to_rejects_with_row_and_reason() -> None:
    smiles = ["CCO", "C1CC", "c1ccccc1", "XYZ", "CCN"]
    features, rejects = featurise_table(table(smiles), config_of(FeaturiseConfig))
    assert features.rows.tolist() == [0, 2, 4]
    assert rejects["row"].tolist() == [1, 3]
    assert rejects["smiles"].tolist() == ["C1CC", "XYZ"]
    assert all(rejects["reason"].str.len() > 0)
    np.testing.assert_array_equal(features.y, [0.0, 0.5, 1.0])


def test_reject_fraction_failure_names_the_setting_and_rows() -> None:
    smiles = ["CCO", "C1CC", "CCC", "CCN"]
    _, rejects = featurise_table(table(smiles), config_of(FeaturiseConfig))
    check_reject_fraction(4, rejects, 0.5, where="x.csv")  # 25% allowed under 50%
    with pytest.raises(TooManyRejectsError, match=r"1 of 4.*max_reject_fraction=0.01.*row 1 'C1CC'"):
        check_reject_fraction(4, rejects, 0.01, where="x.csv")


def test_features_round_trip_and_bytes_are_reproducible(tmp_path: Path) -> None:
    cfg = config_of(FeaturiseConfig, n_bits=1024)
    features, _ = featurise_table(table(MOLECULES), cfg)
    save_features(features, tmp_path / "a.npz", cfg)
    save_features(features, tmp_path / "b.npz", cfg)
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    back = load_features(tmp_path / "a.npz")
    np.testing.assert_array_equal(back.X, features.X)
    np.testing.assert_array_equal(back.rows, features.rows)
    np.testing.assert_array_equal(back.y, features.y)


def test_featurise_cli_fails_cleanly_on_too_many_rejects(tmp_path: Path) -> None:
    import json

    from esol.cli import main

    split = tmp_path / "train.csv"
    table(["CCO", "C1CC", "XYZ"]).to_csv(split, index=False)
    log = tmp_path / "featurise.log"
    rc = main(
        [
            "featurise",
            "--params",
            json.dumps({**defaults()["featurise"], "max_reject_fraction": 0.01}),
            "--input",
            str(split),
            "--output",
            str(tmp_path / "train.npz"),
            "--rejects",
            str(tmp_path / "rejects.csv"),
        ]
    )
    assert rc == 1
    assert not (tmp_path / "train.npz").exists()
    assert "C1CC" in (tmp_path / "rejects.csv").read_text()
    del log


def test_descriptor_sets_give_one_row_per_molecule_and_one_column_per_descriptor() -> None:
    from rdkit import Chem
    from rdkit.Chem import Descriptors

    smiles = ["CCO", "c1ccccc1O", "CC(=O)[O-].[Na+]"]
    X = featurise_smiles(smiles, config_of(FeaturiseConfig, representation="rdkit_descriptors_2d"))
    assert X.shape[0] == 3 and X.shape[1] > 100
    # Row i is molecule i: its molecular weight and logP appear in its own row.
    for i, s in enumerate(smiles):
        mol = Chem.MolFromSmiles(s)
        assert np.isclose(X[i], Descriptors.MolWt(mol), rtol=1e-6).any(), s
        assert np.isclose(X[i], Descriptors.MolLogP(mol), rtol=1e-5).any(), s
    alone = featurise_smiles(smiles[1:2], config_of(FeaturiseConfig, representation="rdkit_descriptors_2d"))
    np.testing.assert_array_equal(alone[0], X[1])


def test_scaling_standardises_descriptors_and_leaves_fingerprints_alone() -> None:
    assert fit_scaling(np.array([[0, 1, 1], [1, 0, 0]], dtype=np.float32)) is None
    X = np.array([[1.0, 100.0, np.nan], [3.0, 300.0, 5.0], [5.0, np.inf, 7.0]], dtype=np.float32)
    scaling = fit_scaling(X)
    assert scaling is not None
    mean, std = scaling
    np.testing.assert_allclose(mean, [3.0, 200.0, 6.0])
    scaled = apply_scaling(X, mean, std)
    np.testing.assert_allclose(scaled[:, 0], [-1.2247449, 0.0, 1.2247449], rtol=1e-6)
    assert scaled[2, 1] == 0.0 and scaled[0, 2] == 0.0  # inf and NaN become the mean
    assert np.isfinite(scaled).all()
    assert apply_scaling(np.array([[1e9, 200.0, 6.0]], dtype=np.float32), mean, std)[0, 0] == 10.0  # clipped


def test_featurise_logs_its_progress_as_plain_lines(tmp_path: Path) -> None:
    """In a rule (stderr is the log file) the progress is a line, not a bar: done, n of the shard's rows."""
    import json
    import subprocess
    import sys

    split = tmp_path / "train.csv"
    table(["CCO", "c1ccccc1O", "CC(=O)O", "CCN", "CCCl", "CC=O"]).to_csv(split, index=False)
    log = tmp_path / "featurise.log"
    command = [
        sys.executable, "-m", "esol", "featurise", "--log", str(log), "--params", json.dumps({**defaults()["featurise"], "chunk_size": 2}),
        "--input", str(split), "--output", str(tmp_path / "train.npz"), "--rejects", str(tmp_path / "rejects.csv"),
        "--shard", "1", "--shards", "2",
    ]  # fmt: skip
    subprocess.run(command, check=True, timeout=300)
    text = log.read_text()
    assert f"featurise {split} shard 2/2: done, 3/3 molecules (100.0%) in " in text, text
    assert "\r" not in text
