"""Featurisation: SMILES -> fingerprint matrix through molflux, with invalid SMILES set aside.

Invalid SMILES never crash a run and are never dropped silently: each goes to a
rejects table (row, SMILES, reason); too many rejects fail the step.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from snakedvc.arrays import load_arrays, save_arrays
from snakedvc.config import FeaturiseConfig
from snakedvc.rdkit_quiet import quiet_rdkit

log = logging.getLogger(__name__)

# Representations whose output is a 0/1 bit vector, stored bit-packed.
BIT_REPRESENTATIONS = {"morgan", "ecfp", "fcfp", "maccs_rdkit", "topological", "atom_pair"}
# Representations that take radius / n_bits.
MORGAN_LIKE = {"morgan", "ecfp", "fcfp"}
REJECT_COLUMNS = ("row", "smiles", "reason")


class TooManyRejectsError(RuntimeError):
    """More SMILES were invalid than the configured fraction allows."""


@dataclass(frozen=True)
class FeatureSet:
    rows: np.ndarray  # int64, the molecule's row in the raw CSV
    y: np.ndarray  # float64 targets
    X: np.ndarray  # float32 features, n x n_features

    def __len__(self) -> int:
        return len(self.rows)


def check_smiles(smiles: str) -> str | None:
    """Return None when RDKit parses and sanitises ``smiles``, else the reason it fails."""
    from rdkit import Chem

    if not smiles.strip():
        return "empty SMILES"
    with quiet_rdkit() as messages:
        mol = Chem.MolFromSmiles(smiles, sanitize=False)
        if mol is None:
            detail = next((m for m in messages if "Parse Error" in m), "")
            detail = re.sub(r"^\[[0-9:]+\]\s*", "", detail)
            return f"unparsable SMILES ({detail})" if detail else "unparsable SMILES"
        if mol.GetNumAtoms() == 0:
            return "SMILES has no atoms"
        try:
            Chem.SanitizeMol(mol)
        except Exception as error:  # RDKit raises several sanitisation exception types
            return f"{type(error).__name__}: {error}".strip()
    return None


def featurise_smiles(smiles: list[str], cfg: FeaturiseConfig) -> np.ndarray:
    """Featurise valid SMILES with molflux; returns float32 (n, n_features)."""
    from molflux.features import load_representation

    kwargs = {"radius": cfg.radius, "n_bits": cfg.n_bits} if cfg.representation in MORGAN_LIKE else {}
    representation = load_representation(cfg.representation)
    if not smiles:
        width = cfg.n_bits if cfg.representation in MORGAN_LIKE else 0
        return np.zeros((0, width), dtype=np.float32)
    with quiet_rdkit():
        output = representation.featurise(smiles, **kwargs)
    (values,) = output.values() if len(output) == 1 else (np.hstack([np.asarray(v) for v in output.values()]),)
    return np.asarray(values, dtype=np.float32)


def featurise_table(table: pd.DataFrame, cfg: FeaturiseConfig) -> tuple[FeatureSet, pd.DataFrame]:
    """Split a (row, smiles, y) table into features of the valid molecules and a rejects table."""
    reasons = [check_smiles(s) for s in table["smiles"]]
    bad = np.array([r is not None for r in reasons], dtype=bool)
    rejects = pd.DataFrame(
        {
            "row": table["row"].to_numpy()[bad],
            "smiles": table["smiles"].to_numpy()[bad],
            "reason": [r for r in reasons if r is not None],
        },
        columns=list(REJECT_COLUMNS),
    )
    good = table.loc[~bad]
    X = featurise_smiles(good["smiles"].tolist(), cfg)
    features = FeatureSet(
        rows=good["row"].to_numpy(dtype=np.int64),
        y=good["y"].to_numpy(dtype=np.float64),
        X=X,
    )
    return features, rejects


def check_reject_fraction(n_total: int, rejects: pd.DataFrame, max_fraction: float, where: str) -> None:
    n_bad = len(rejects)
    fraction = n_bad / n_total if n_total else 0.0
    log.info("%s: %d of %d SMILES rejected (%.2f%%)", where, n_bad, n_total, 100 * fraction)
    for row in rejects.head(20).itertuples():
        log.warning("rejected row %d %r: %s", row.row, row.smiles, row.reason)
    if fraction > max_fraction:
        examples = "; ".join(f"row {r.row} {r.smiles!r}: {r.reason}" for r in rejects.head(3).itertuples())
        raise TooManyRejectsError(
            f"{where}: {n_bad} of {n_total} SMILES are invalid ({100 * fraction:.1f}%), more than "
            f"featurise.max_reject_fraction={max_fraction:g}. First: {examples}"
        )


def save_features(features: FeatureSet, path: str | Path, cfg: FeaturiseConfig) -> None:
    packed = cfg.representation in BIT_REPRESENTATIONS
    matrix = np.packbits(features.X.astype(np.uint8), axis=1) if packed else features.X
    save_arrays(
        path,
        rows=features.rows,
        y=features.y,
        X=matrix,
        packed=np.array(packed),
        n_features=np.array(features.X.shape[1], dtype=np.int64),
    )


def load_features(path: str | Path) -> FeatureSet:
    arrays = load_arrays(path)
    X = arrays["X"]
    if bool(arrays["packed"]):
        X = np.unpackbits(X, axis=1, count=int(arrays["n_features"]))
    return FeatureSet(rows=arrays["rows"], y=arrays["y"], X=X.astype(np.float32))


def write_rejects(rejects: pd.DataFrame, path: str | Path) -> None:
    from snakedvc.io import atomic_path

    with atomic_path(path) as tmp:
        rejects.to_csv(tmp, index=False)
