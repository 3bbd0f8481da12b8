from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from snakedvc.config import FeaturiseConfig
from snakedvc.features import (
    TooManyRejectsError,
    check_reject_fraction,
    check_smiles,
    featurise_table,
    load_features,
    save_features,
)

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


@pytest.mark.parametrize(("radius", "n_bits"), [(2, 2048), (3, 1024)])
def test_molflux_morgan_bits_equal_rdkit_morgan_generator(radius: int, n_bits: int) -> None:
    features, rejects = featurise_table(table(MOLECULES), FeaturiseConfig(radius=radius, n_bits=n_bits))
    assert rejects.empty
    np.testing.assert_array_equal(features.X, rdkit_bits(MOLECULES, radius, n_bits))


def test_radius_is_passed_to_molflux() -> None:
    r1, _ = featurise_table(table(MOLECULES), FeaturiseConfig(radius=1))
    r2, _ = featurise_table(table(MOLECULES), FeaturiseConfig(radius=2))
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
    features, rejects = featurise_table(table(smiles), FeaturiseConfig())
    assert features.rows.tolist() == [0, 2, 4]
    assert rejects["row"].tolist() == [1, 3]
    assert rejects["smiles"].tolist() == ["C1CC", "XYZ"]
    assert all(rejects["reason"].str.len() > 0)
    np.testing.assert_array_equal(features.y, [0.0, 0.5, 1.0])


def test_reject_fraction_failure_names_the_setting_and_rows() -> None:
    smiles = ["CCO", "C1CC", "CCC", "CCN"]
    _, rejects = featurise_table(table(smiles), FeaturiseConfig())
    check_reject_fraction(4, rejects, 0.5, where="x.csv")  # 25% allowed under 50%
    with pytest.raises(TooManyRejectsError, match=r"1 of 4.*max_reject_fraction=0.01.*row 1 'C1CC'"):
        check_reject_fraction(4, rejects, 0.01, where="x.csv")


def test_features_round_trip_and_bytes_are_reproducible(tmp_path: Path) -> None:
    cfg = FeaturiseConfig(n_bits=1024)
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

    from snakedvc.cli import main

    split = tmp_path / "train.csv"
    table(["CCO", "C1CC", "XYZ"]).to_csv(split, index=False)
    log = tmp_path / "featurise.log"
    rc = main(
        [
            "featurise",
            "--params",
            json.dumps({"max_reject_fraction": 0.01}),
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
