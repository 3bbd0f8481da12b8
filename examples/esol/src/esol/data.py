"""Reading the molecule table and splitting it into train / valid / test."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from esol.config import SplitConfig
from esol.rdkit_quiet import quiet_rdkit

SPLITS = ("train", "valid", "test")
# Columns of every split file: original row number in the raw CSV, SMILES, target.
COLUMNS = ("row", "smiles", "y")


class DataError(ValueError):
    """The input table is missing, unreadable or lacks a required column."""


def read_molecules(path: str | Path, smiles_column: str, target_column: str, limit: int = 0) -> pd.DataFrame:
    """Read the raw CSV into a frame with columns row, smiles, y."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"input file not found: {path}")
    try:
        table = pd.read_csv(path, dtype={smiles_column: str}, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise DataError(
            f"{path} is empty: no header and no rows (expected a CSV with columns '{smiles_column}' and "
            f"'{target_column}')"
        ) from None
    for column in (smiles_column, target_column):
        if column not in table.columns:
            raise DataError(f"column '{column}' not found in {path} (columns: {', '.join(map(str, table.columns))})")
    if table.empty:
        raise DataError(f"{path} has a header but no molecule rows: nothing to split or train on")
    if limit:
        table = table.head(limit)
    target = pd.to_numeric(table[target_column], errors="coerce")
    bad = target.isna()
    if bad.any():
        first = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(
            f"{int(bad.sum())} non-numeric value(s) in target column '{target_column}' of {path}; "
            f"first at data row {first + 1}: {table[target_column].iloc[first]!r}"
        )
    return pd.DataFrame(
        {
            "row": np.arange(len(table), dtype=np.int64),
            "smiles": table[smiles_column].astype(str).str.strip().to_numpy(),
            "y": target.to_numpy(dtype=np.float64),
        }
    )


def _sizes(n: int, fractions: tuple[float, float, float]) -> tuple[int, int, int]:
    n_train = int(round(fractions[0] * n))
    n_valid = int(round(fractions[1] * n))
    n_train = min(n_train, n)
    n_valid = min(n_valid, n - n_train)
    return n_train, n_valid, n - n_train - n_valid


def random_split(n: int, cfg: SplitConfig) -> list[np.ndarray]:
    order = np.random.default_rng(cfg.seed).permutation(n)
    n_train, n_valid, _ = _sizes(n, cfg.fractions)
    return [
        np.sort(order[:n_train]),
        np.sort(order[n_train : n_train + n_valid]),
        np.sort(order[n_train + n_valid :]),
    ]


def scaffold_key(smiles: str) -> str:
    """Bemis–Murcko scaffold SMILES; unparsable SMILES form a group of their own."""
    from rdkit import Chem
    from rdkit.Chem.Scaffolds import MurckoScaffold

    mol = Chem.MolFromSmiles(smiles) if smiles else None
    if mol is None:
        return "invalid:" + smiles
    return str(MurckoScaffold.MurckoScaffoldSmiles(mol=mol, includeChirality=False))


def scaffold_split(smiles: list[str], cfg: SplitConfig) -> list[np.ndarray]:
    """Whole scaffold groups go to one split: large groups first, the rest in seeded order."""
    with quiet_rdkit():
        groups: dict[str, list[int]] = defaultdict(list)
        for index, smi in enumerate(smiles):
            groups[scaffold_key(smi)].append(index)
    n_train, n_valid, n_test = _sizes(len(smiles), cfg.fractions)
    rng = np.random.default_rng(cfg.seed)
    keys = sorted(groups)
    big = sorted((k for k in keys if len(groups[k]) > max(n_test, 1) / 2), key=lambda k: (-len(groups[k]), k))
    small = [k for k in keys if k not in set(big)]
    small = [small[i] for i in rng.permutation(len(small))]
    train: list[int] = []
    valid: list[int] = []
    test: list[int] = []
    for key in big + small:
        members = groups[key]
        if len(train) + len(members) <= n_train:
            train.extend(members)
        elif len(valid) + len(members) <= n_valid:
            valid.extend(members)
        else:
            test.extend(members)
    return [np.sort(np.asarray(part, dtype=np.int64)) for part in (train, valid, test)]


def split_molecules(table: pd.DataFrame, cfg: SplitConfig) -> dict[str, pd.DataFrame]:
    if cfg.method == "random":
        parts = random_split(len(table), cfg)
    elif cfg.method == "scaffold":
        parts = scaffold_split(table["smiles"].tolist(), cfg)
    else:
        raise ValueError(f"unknown split method '{cfg.method}' (expected random or scaffold)")
    return {name: table.iloc[idx].reset_index(drop=True) for name, idx in zip(SPLITS, parts, strict=True)}


def write_split(frame: pd.DataFrame, path: str | Path) -> None:
    from snakedvc import atomic_path

    with atomic_path(path) as tmp:
        frame.loc[:, list(COLUMNS)].to_csv(tmp, index=False, float_format="%.10g")


def read_split(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"input file not found: {path}")
    return pd.read_csv(path, dtype={"smiles": str}, keep_default_na=False)
