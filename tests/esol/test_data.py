from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from esol.config import SplitConfig
from esol.data import DataError, read_molecules, scaffold_key, split_molecules
from tests.conftest import REPO
from tests.esol.configs import config_of

ESOL = REPO / "data" / "raw" / "esol.csv"
SMILES = "smiles"
TARGET = "measured log solubility in mols per litre"


@pytest.fixture(scope="module")
def esol() -> pd.DataFrame:
    return read_molecules(ESOL, SMILES, TARGET)


def test_reads_all_esol_rows(esol: pd.DataFrame) -> None:
    assert len(esol) == 1128
    assert list(esol.columns) == ["row", "smiles", "y"]
    assert esol["row"].tolist() == list(range(1128))


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.csv"
    with pytest.raises(DataError, match="nowhere.csv"):
        read_molecules(missing, SMILES, TARGET)


def test_missing_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("smiles,y\nCCO,1.0\n")
    with pytest.raises(DataError, match="column 'logS' not found"):
        read_molecules(path, "smiles", "logS")


def test_an_empty_or_header_only_csv_is_named_at_the_first_step(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataError, match=rf"{empty} is empty: no header and no rows .*'smiles'"):
        read_molecules(empty, "smiles", "y")
    header = tmp_path / "header.csv"
    header.write_text("smiles,y\n")
    with pytest.raises(DataError, match=rf"{header} has a header but no molecule rows"):
        read_molecules(header, "smiles", "y")


def test_non_numeric_target_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("smiles,y\nCCO,1.0\nCCC,oops\n")
    with pytest.raises(DataError, match="row 2.*oops"):
        read_molecules(path, "smiles", "y")


@pytest.mark.parametrize("method", ["random", "scaffold"])
def test_split_is_deterministic_and_disjoint(esol: pd.DataFrame, method: str) -> None:
    cfg = config_of(SplitConfig, method=method, fractions=(0.8, 0.1, 0.1), seed=3)
    first = split_molecules(esol, cfg)
    second = split_molecules(esol, cfg)
    for name in first:
        pd.testing.assert_frame_equal(first[name], second[name])
    rows = [set(part["row"]) for part in first.values()]
    assert rows[0].isdisjoint(rows[1]) and rows[0].isdisjoint(rows[2]) and rows[1].isdisjoint(rows[2])
    assert set().union(*rows) == set(range(len(esol)))
    # Sizes close to the fractions (scaffold groups make them approximate).
    assert abs(len(first["train"]) / len(esol) - 0.8) < 0.05


def test_random_split_depends_on_seed(esol: pd.DataFrame) -> None:
    a = split_molecules(esol, config_of(SplitConfig, seed=0))["test"]["row"].tolist()
    b = split_molecules(esol, config_of(SplitConfig, seed=1))["test"]["row"].tolist()
    assert a != b


def test_scaffold_split_keeps_each_scaffold_in_one_split(esol: pd.DataFrame) -> None:
    parts = split_molecules(esol, config_of(SplitConfig, method="scaffold", seed=0))
    owner: dict[str, str] = {}
    for name, part in parts.items():
        for smi in part["smiles"]:
            key = scaffold_key(smi)
            assert owner.setdefault(key, name) == name, f"scaffold {key!r} in {owner[key]} and {name}"
    assert len(set(owner.values())) == 3


def test_scaffold_of_benzene_derivatives_is_benzene() -> None:
    assert scaffold_key("Cc1ccccc1") == scaffold_key("Oc1ccccc1") == "c1ccccc1"
    assert scaffold_key("CCO") == ""
    assert scaffold_key("C1CC").startswith("invalid:")


def test_split_file_round_trip(tmp_path: Path, esol: pd.DataFrame) -> None:
    from esol.data import read_split, write_split

    part = split_molecules(esol, config_of(SplitConfig))["valid"]
    write_split(part, tmp_path / "valid.csv")
    back = read_split(tmp_path / "valid.csv")
    assert back["row"].tolist() == part["row"].tolist()
    assert back["smiles"].tolist() == part["smiles"].tolist()
    np.testing.assert_allclose(back["y"], part["y"], rtol=1e-9)
