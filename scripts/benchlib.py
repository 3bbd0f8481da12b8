"""Helpers for the benchmark scripts: timing commands and writing docs/benchmarks.md sections.

Each script owns one section, delimited by HTML comments, and rewrites only that
section, so figures from different scripts live side by side in one file.
"""

from __future__ import annotations

import platform
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Two environments (scripts/setup): the engine runs snakemake, .venv-esol the ESOL steps. A
# benchmark that imports the steps' code runs in the second and calls the engine for snakemake.
ENGINE_PYTHON = REPO / ".venv" / "bin" / "python"
SNAKEMAKE = [str(ENGINE_PYTHON), "-m", "snakemake"]

HEADER = "# Benchmarks\n\nFigures written by the scripts named in each section; rerun them to refresh.\n"


def timed(cmd: list[str], cwd: Path | str) -> float:
    """Wall seconds of a command that must succeed."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed


def alternated(variants: dict[str, tuple[list[str], Path]], repeats: int, before: Any = None) -> dict[str, list[float]]:
    """Wall seconds of each variant's command, ``repeats`` times, the variants taking turns (A B C A B C ...)
    so that drift in the machine's load falls on all of them alike. ``before(name)`` runs before each
    timed run (e.g. to clear the last run's outputs)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, (cmd, cwd) in variants.items():
            if before is not None:
                before(name)
            times[name].append(timed(cmd, cwd))
    return times


def spread(values: list[float]) -> str:
    """'median (min–max, n=N)' of a list of seconds."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f}, n={len(values)})"


def machine() -> str:
    import os

    return f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def write_section(path: Path | str, name: str, body: str) -> None:
    path = Path(path)
    text = path.read_text() if path.exists() else HEADER
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def rdkit_smiles() -> list[str]:
    """The SMILES that ship in RDKit's wheel: 10,000 (WEHI) + 4,999 (NCI), for large tests and benchmarks."""
    import csv
    import os

    import rdkit

    data = Path(os.path.dirname(rdkit.__file__)) / "Data"
    with open(data / "Pains/test_data/wehi_mols.csv", newline="") as handle:
        wehi = [row[0] for row in csv.reader(handle) if row]
    nci = [line.split()[0] for line in (data / "NCI/first_5K.smi").read_text().splitlines() if line.strip()]
    return wehi + nci


def write_synthetic_split(path: Path | str, n: int, seed: int = 0) -> Path:
    """A split CSV (row, smiles, y) of ``n`` molecules: RDKit's shipped SMILES, repeated as random
    (non-canonical) SMILES of the same molecules, so the parser sees new strings. Streamed to disk."""
    import csv
    import random

    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")  # type: ignore[attr-defined]
    rng = random.Random(seed)
    mols = [m for m in (Chem.MolFromSmiles(s) for s in rdkit_smiles()) if m is not None]
    path = Path(path)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["row", "smiles", "y"])
        for i in range(n):
            mol = mols[i % len(mols)]
            smiles = Chem.MolToSmiles(mol) if i < len(mols) else Chem.MolToSmiles(mol, doRandom=True)
            writer.writerow([i, smiles, f"{rng.uniform(-10, 2):.4f}"])
    return path


def esol_section(name: str, **overrides: Any) -> dict[str, Any]:
    """An ESOL config section (``split``, ``featurise``, ``train``) as the workflow's schema defaults give
    it, with ``overrides``: what a step's ``--params`` takes (the schema is the one place for defaults)."""
    from snakedvc.engine.config import load_schema, validate_config

    defaults = validate_config({}, load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    return {**defaults[name], **overrides}


def esol_config(cls: type, **overrides: Any) -> Any:
    """An ESOL step's config (esol.config's SplitConfig, FeaturiseConfig, TrainConfig) built from
    ``esol_section``."""
    from esol.config import section

    name = {"SplitConfig": "split", "FeaturiseConfig": "featurise", "TrainConfig": "train"}[cls.__name__]
    return section(cls, esol_section(name, **overrides))
