"""Featurisation: SMILES -> feature matrix, streamed in chunks and sharded across jobs.

Invalid SMILES never crash a run and are never dropped silently: each goes to a
rejects table (row, SMILES, reason); too many rejects fail the step.

ECFP (molflux's ``morgan``) takes a fast path: each SMILES is parsed once (the
validity check's molecule is reused) and fingerprinted by RDKit's MorganGenerator,
bit-identical to molflux (tested), without molflux's per-molecule re-parsing. Any
other molflux representation goes through molflux. Input is read and output
written a chunk at a time, so memory does not grow with the input; a shard is a
contiguous block of rows, and gathering the shards in order gives the same bytes
as one unsharded run.
"""

from __future__ import annotations

import csv
import itertools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from esol.arrays import NpzWriter, iter_array_chunks, load_arrays, save_arrays
from esol.config import FeaturiseConfig
from esol.rdkit_quiet import quiet_rdkit
from snakedvc import progress

log = logging.getLogger(__name__)

# Representations whose output is a 0/1 bit vector, stored bit-packed.
BIT_REPRESENTATIONS = {"morgan", "ecfp", "fcfp", "maccs_rdkit", "topological", "atom_pair"}
# Representations that take radius / n_bits.
MORGAN_LIKE = {"morgan", "ecfp", "fcfp"}
REJECT_COLUMNS = ("row", "smiles", "reason")
# Standardised descriptors beyond this many standard deviations are clipped: a single
# extreme value (descriptors span many orders of magnitude) must not dominate a batch.
SCALED_CLIP = 10.0


class TooManyRejectsError(RuntimeError):
    """More SMILES were invalid than the configured fraction allows."""


@dataclass(frozen=True)
class FeatureSet:
    rows: np.ndarray  # int64, the molecule's row in the raw CSV
    y: np.ndarray  # float64 targets
    X: np.ndarray  # float32 features, n x n_features

    def __len__(self) -> int:
        return len(self.rows)


def parse_smiles(smiles: str, messages: list[str]) -> tuple[Any, str | None]:
    """(molecule, None) when RDKit parses and sanitises ``smiles``, else (None, reason).

    Call inside ``quiet_rdkit()``, passing its message list (the parse error text comes from there).
    """
    from rdkit import Chem

    if not smiles.strip():
        return None, "empty SMILES"
    messages.clear()
    mol = Chem.MolFromSmiles(smiles, sanitize=False)
    if mol is None:
        detail = next((m for m in messages if "Parse Error" in m), "")
        detail = re.sub(r"^\[[0-9:]+\]\s*", "", detail)
        return None, f"unparsable SMILES ({detail})" if detail else "unparsable SMILES"
    if mol.GetNumAtoms() == 0:
        return None, "SMILES has no atoms"
    try:
        Chem.SanitizeMol(mol)
    except Exception as error:  # RDKit raises several sanitisation exception types
        return None, f"{type(error).__name__}: {error}".strip()
    return mol, None


def check_smiles(smiles: str) -> str | None:
    """Return None when RDKit parses and sanitises ``smiles``, else the reason it fails."""
    with quiet_rdkit() as messages:
        return parse_smiles(smiles, messages)[1]


def uses_fast_path(cfg: FeaturiseConfig) -> bool:
    return cfg.engine == "auto" and cfg.representation == "morgan"


def morgan_generator(radius: int, n_bits: int) -> Any:
    """RDKit's ECFP generator: the same bits as molflux ``morgan`` with the same radius and n_bits (tested)."""
    from rdkit.Chem import rdFingerprintGenerator

    return rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)


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
    # One entry per output column: a fingerprint is one column of vectors, descriptor
    # sets (rdkit_descriptors_2d) are many columns of scalars. Rows stay molecules.
    columns = [np.asarray(v, dtype=np.float64).reshape(len(smiles), -1) for v in output.values()]
    with np.errstate(over="ignore"):  # a few descriptors (Ipc) overflow float32: inf, handled by scaling
        return np.hstack(columns).astype(np.float32)


def is_binary(X: np.ndarray) -> bool:
    return bool(np.isin(X, (0.0, 1.0)).all())


def fit_scaling(X: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-feature mean and std of the training matrix, over finite values; None for 0/1 fingerprints."""
    if X.size == 0 or is_binary(X):
        return None
    values = np.where(np.isfinite(X), X, np.nan).astype(np.float64)
    with np.errstate(all="ignore"):
        mean = np.nan_to_num(np.nanmean(values, axis=0))
        std = np.nan_to_num(np.nanstd(values, axis=0))
    std[std == 0] = 1.0
    return mean, std


def apply_scaling(X: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Standardise with training statistics; missing or infinite values become the mean, outliers are clipped."""
    with np.errstate(all="ignore"):
        scaled = (X.astype(np.float64) - mean) / std
    scaled[~np.isfinite(scaled)] = 0.0
    return np.clip(scaled, -SCALED_CLIP, SCALED_CLIP).astype(np.float32)


@dataclass(frozen=True)
class Chunk:
    """Featurised rows of one chunk: X as stored (bit-packed uint8 for fingerprints, else float32)."""

    rows: np.ndarray
    y: np.ndarray
    X: np.ndarray
    rejects: pd.DataFrame
    n_features: int  # unpacked width


def featurise_chunk(table: pd.DataFrame, cfg: FeaturiseConfig) -> Chunk:
    """Featurise a (row, smiles, y) table; invalid SMILES go to the chunk's rejects."""
    # Fast path: fingerprint each molecule as soon as it is parsed and checked, then let it go.
    generator = morgan_generator(cfg.radius, cfg.n_bits) if uses_fast_path(cfg) else None
    # A fingerprint's own bytes (RDKit's bit vector in 64-bit words) where the length fills whole
    # words: 1/8 of the bytes of a 0/1 array, and no packing after (15 % more molecules a second).
    as_bytes = generator is not None and cfg.n_bits % 64 == 0
    bits = np.empty((len(table), cfg.n_bits if generator and not as_bytes else 0), dtype=np.uint8)
    packed = bytearray(len(table) * cfg.n_bits // 8 if as_bytes else 0)
    row_bytes = cfg.n_bits // 8
    if as_bytes:
        from rdkit.DataStructs import BitVectToBinaryText
    reasons: list[str | None] = []
    n_good = 0
    with quiet_rdkit() as messages:
        for smiles in table["smiles"]:
            mol, reason = parse_smiles(smiles, messages)
            reasons.append(reason)
            if mol is not None and generator is not None:
                if as_bytes:
                    at = n_good * row_bytes
                    packed[at : at + row_bytes] = BitVectToBinaryText(generator.GetFingerprint(mol))
                else:
                    bits[n_good] = generator.GetFingerprintAsNumPy(mol)
                n_good += 1
    bad = np.array([r is not None for r in reasons], dtype=bool)
    rejects = pd.DataFrame(
        {
            "row": table["row"].to_numpy(dtype=np.int64)[bad],
            "smiles": table["smiles"].to_numpy()[bad],
            "reason": [r for r in reasons if r is not None],
        },
        columns=list(REJECT_COLUMNS),
    )
    good = table.loc[~bad]
    rows, y = good["row"].to_numpy(dtype=np.int64), good["y"].to_numpy(dtype=np.float64)
    if as_bytes:
        # RDKit stores bit i in byte i // 8 least significant first; numpy.packbits, most.
        X = _REVERSED_BITS[np.frombuffer(packed, dtype=np.uint8)[: n_good * row_bytes].reshape(n_good, row_bytes)]
        return Chunk(rows, y, X, rejects, cfg.n_bits)
    X = bits[:n_good] if generator is not None else featurise_smiles(good["smiles"].tolist(), cfg)
    width = int(X.shape[1])
    if cfg.representation in BIT_REPRESENTATIONS:
        X = np.packbits(X.astype(np.uint8, copy=False), axis=1)
    return Chunk(rows, y, X, rejects, width)


# Each byte value with its bits in the opposite order.
_REVERSED_BITS = np.array([int(f"{value:08b}"[::-1], 2) for value in range(256)], dtype=np.uint8)


def featurise_table(table: pd.DataFrame, cfg: FeaturiseConfig) -> tuple[FeatureSet, pd.DataFrame]:
    """Split a (row, smiles, y) table into features of the valid molecules and a rejects table."""
    chunk = featurise_chunk(table, cfg)
    X = chunk.X
    if cfg.representation in BIT_REPRESENTATIONS:
        X = np.unpackbits(X, axis=1, count=chunk.n_features).astype(np.float32)
    return FeatureSet(rows=chunk.rows, y=chunk.y, X=X), chunk.rejects


def shard_bounds(n_rows: int, shard: int, shards: int) -> tuple[int, int]:
    """Rows [start, stop) of a shard: contiguous, balanced (sizes differ by at most 1), covering all rows."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is not in 0..{shards - 1}")
    return n_rows * shard // shards, n_rows * (shard + 1) // shards


def count_rows(path: str | Path) -> int:
    """Data rows of a split CSV, streamed."""
    with open(path, newline="") as handle:
        return sum(1 for _ in csv.reader(handle)) - 1


def read_chunks(path: str | Path, start: int, stop: int | None, chunk_size: int) -> Iterator[pd.DataFrame]:
    """Rows [start, stop) of a split CSV (row, smiles, y) as DataFrames of at most ``chunk_size`` rows."""
    from esol.data import COLUMNS, DataError

    path = Path(path)
    if not path.is_file():
        raise DataError(f"input file not found: {path}")
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or [c for c in COLUMNS if c not in header]:
            raise DataError(f"{path}: expected columns {', '.join(COLUMNS)}, found {header}")
        index = [header.index(c) for c in COLUMNS]
        rows = itertools.islice(reader, start, stop)
        while batch := list(itertools.islice(rows, chunk_size)):
            yield pd.DataFrame(
                {
                    "row": np.array([int(r[index[0]]) for r in batch], dtype=np.int64),
                    "smiles": [r[index[1]] for r in batch],
                    "y": np.array([float(r[index[2]]) for r in batch], dtype=np.float64),
                }
            )


def write_feature_arrays(writer: NpzWriter, chunk: Chunk) -> None:
    writer.append("rows", chunk.rows)
    writer.append("y", chunk.y)
    if len(chunk.rows):  # an empty chunk of a molflux representation has no width to check
        writer.append("X", chunk.X)


def _declare_features(writer: NpzWriter, cfg: FeaturiseConfig) -> None:
    writer.declare("rows", np.int64)
    writer.declare("y", np.float64)
    if cfg.representation in MORGAN_LIKE:
        writer.declare("X", np.uint8, ((cfg.n_bits + 7) // 8,))


def _finish_features(writer: NpzWriter, cfg: FeaturiseConfig, width: int | None) -> None:
    packed = cfg.representation in BIT_REPRESENTATIONS
    writer.declare("X", np.uint8 if packed else np.float32, (0,))
    if width is None:
        width = cfg.n_bits if cfg.representation in MORGAN_LIKE else 0
    writer.scalar("packed", np.array(packed))
    writer.scalar("n_features", np.array(width, dtype=np.int64))


@dataclass(frozen=True)
class ShardResult:
    n_input: int
    rejects: pd.DataFrame


def _concat_rejects(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(REJECT_COLUMNS))


def featurise_file(
    input_csv: str | Path,
    output: str | Path,
    rejects_csv: str | Path,
    cfg: FeaturiseConfig,
    shard: int = 0,
    shards: int = 1,
    chunk_size: int = 10_000,
    stored: bool = False,
) -> ShardResult:
    """Featurise one shard of a split CSV into a features .npz and a rejects CSV, a chunk at a time.

    A whole split (one shard) has its reject fraction checked here; shards are checked together
    when gathered. Either way a failed check writes no features file. ``stored``: arrays left
    uncompressed, for training that streams rows straight from the file.
    """
    start, stop = (0, None) if shards == 1 else shard_bounds(count_rows(input_csv), shard, shards)
    n_input, width = 0, None
    rejects = []
    where = f"featurise {input_csv}" + (f" shard {shard + 1}/{shards}" if shards > 1 else "")
    # A bar for a person at a terminal (a million molecules take a while); plain lines in a rule's log.
    chunks = progress(
        read_chunks(input_csv, start, stop, chunk_size),
        total=None if stop is None else stop - start,
        desc=where,
        unit="molecules",
        weight=len,
    )
    with NpzWriter(output, stored=stored) as writer:
        _declare_features(writer, cfg)
        for table in chunks:
            chunk = featurise_chunk(table, cfg)
            write_feature_arrays(writer, chunk)
            n_input += len(table)
            rejects.append(chunk.rejects)
            if len(chunk.rows) and width is None:
                width = chunk.n_features
        _finish_features(writer, cfg, width)
        table = _concat_rejects(rejects)
        write_rejects(table, rejects_csv)
        if shards == 1:
            check_reject_fraction(n_input, table, cfg.max_reject_fraction, str(input_csv))
    return ShardResult(n_input, table)


def gather_features(
    shard_features: list[str | Path],
    shard_rejects: list[str | Path],
    output: str | Path,
    rejects_csv: str | Path,
    cfg: FeaturiseConfig,
    where: str,
    stored: bool = False,
) -> tuple[int, pd.DataFrame]:
    """Concatenate shards in order into one features file and one rejects file; check the reject fraction.

    Streams the arrays: memory is one block, however large the shards. Returns (molecules, rejects).
    """
    table = _concat_rejects([pd.read_csv(p, dtype={"smiles": str}, keep_default_na=False) for p in shard_rejects])
    widths = set()
    n_valid = 0
    with NpzWriter(output, stored=stored) as writer:
        _declare_features(writer, cfg)
        for path in shard_features:
            arrays = zip_array_names(path)
            for name in ("rows", "y", "X"):
                if name not in arrays:
                    raise ValueError(f"{path}: not a features file (no {name!r} array)")
            n_here = 0
            for block in iter_array_chunks(path, "rows"):
                writer.append("rows", block)
                n_here += len(block)
            for block in iter_array_chunks(path, "y"):
                writer.append("y", block)
            if n_here:
                for block in iter_array_chunks(path, "X"):
                    writer.append("X", block)
                widths.add(int(next(iter_array_chunks(path, "n_features"))[0]))
            n_valid += n_here
        if len(widths) > 1:
            raise ValueError(f"{where}: shards disagree on the number of features: {sorted(widths)}")
        _finish_features(writer, cfg, widths.pop() if widths else None)
        # Checked before the features file is written: a failed gather leaves no output.
        check_reject_fraction(n_valid + len(table), table, cfg.max_reject_fraction, where)
    write_rejects(table, rejects_csv)
    return n_valid, table


def zip_array_names(path: str | Path) -> set[str]:
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return {name.removesuffix(".npy") for name in archive.namelist()}


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
    from snakedvc import atomic_path

    with atomic_path(path) as tmp:
        rejects.to_csv(tmp, index=False)
