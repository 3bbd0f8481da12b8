"""`snakedvc init`: what a project needs to run on the kit, written into an existing git repository.

- ``profiles/local`` and ``profiles/slurm`` (partitions and the controller job to fill in for your
  cluster): the very files the kit's own examples run with, shipped as package data;
- ``.gitignore`` lines for Snakemake's and the kit's folders, logs, checkpoints, and the outputs
  under ``results/`` (their ``.dvc`` files and DVC's own ``.gitignore`` files stay visible to git);
- ``dvc init`` where the repository is no DVC project yet, and a ``dvc.yaml`` naming the run's
  params, metrics and plots;
- the config's ``snakedvc:`` section (in ``config.yaml``, appended when the file has none).

Files the kit writes whole are never overwritten: if one exists, nothing is written and the list of
what exists is the answer. ``.gitignore`` and the config only get what they lack. ``--dry-run`` says
what would be written.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

PROFILES = ("local", "slurm")


class InitError(RuntimeError):
    """init cannot go on: the message says what is in the way."""


# Outputs live under results/: git ignores them, but not the .dvc files DVC writes beside tracked
# ones, nor the .gitignore files it writes there (git must see every .dvc file: DVC refuses one it ignores).
# /.venv/: the tutorial makes the environment in the project, and then commits with `git add -A`.
GITIGNORE = [
    "/.venv/",
    "/.snakemake/",
    "/.snakedvc/",
    "/logs/",
    "/.checkpoints/",
    "/results/**",
    "!/results/**/",
    "!/results/**/*.dvc",
    "!/results/**/.gitignore",
]
DVC_YAML = """\
# Read by `dvc exp show` / `dvc plots`: each run's (and experiment's) params, metrics and plots.
# No stages: Snakemake runs the steps; snakedvc records each run as an experiment.
params:
  # The config the run really used (config.yaml + --config), written by snakedvc at the end of a run.
  - results/params.yaml
metrics:
  # Your training's metrics file (name it in the config's snakedvc.experiment.metrics too).
  - results/metrics.json
  # A sweep trial's metric, the rung it reached, whether it won (snakedvc writes it).
  - results/trial.json
plots:
  # Per-epoch curves, if your training logs to results/live (Resumable(..., live="results/live")).
  - results/live/plots/metrics:
      x: step
"""
CONFIG_SECTION = """\
snakedvc:
  # The kit's settings (every key has a default; schema: snakedvc's snakedvc.schema.yaml).
  experiment:
    # Where the run's effective config goes (dvc.yaml lists it under params).
    params: results/params.yaml
    # A run that did not write these saves no experiment.
    metrics: [results/metrics.json]
  sweep:
    enabled: false
    # A key of each trial's metrics file, and whether higher or lower is better.
    metric: valid_loss
    direction: min
    # The config key each rung sets to its epochs.
    budget: train.epochs
"""


@dataclass
class Plan:
    """What init would write: whole files (path -> text) and lines or sections appended to files."""

    files: dict[str, str]
    appends: dict[str, str]
    dvc_init: bool

    def describe(self) -> list[str]:
        said = [
            "edit    .gitignore: comment out lines that hide .dvc files, add snakedvc's"
            if path == ".gitignore"
            else f"write   {path}"
            for path in self.files
        ]
        said += [f"append  {path}: {text.strip().splitlines()[0]}..." for path, text in self.appends.items()]
        return said + (["run     dvc init"] if self.dvc_init else [])


def shipped_profile(name: str) -> dict[str, str]:
    """The files of one of the kit's profiles (file name -> text)."""
    folder = resources.files("snakedvc") / "profiles" / name
    return {
        entry.name: entry.read_text() for entry in sorted(folder.iterdir(), key=lambda e: e.name) if entry.is_file()
    }


def plan(root: Path, config: str = "config.yaml") -> Plan:
    """What `snakedvc init` would do in ``root``; InitError (listing them) where files it writes exist."""
    files = {f"profiles/{name}/{file}": text for name in PROFILES for file, text in shipped_profile(name).items()}
    files["dvc.yaml"] = DVC_YAML
    existing = sorted(path for path in files if (root / path).exists())
    if existing:
        raise InitError(
            "snakedvc init writes no file that exists, and these do:\n  "
            + "\n  ".join(existing)
            + "\nMove them aside (or compare them with the kit's: snakedvc init --dry-run in an empty repository)."
        )
    appends = {}
    ignore = root / ".gitignore"
    lines = ignore.read_text().splitlines() if ignore.is_file() else []
    missing = [line for line in GITIGNORE if line not in set(lines)]
    added = "\n# snakedvc: Snakemake's and the kit's folders, logs, checkpoints, outputs\n" + "\n".join(missing) + "\n"
    hiding = lines_hiding_dvc_files(lines, added if missing else "")
    if hiding:
        files[".gitignore"] = (
            "\n".join(
                f"# snakedvc init: was {line!r}, which hid the .dvc files DVC needs git to see "
                "(git cannot re-include a file in an ignored folder); the lines below ignore the outputs"
                if number in hiding
                else line
                for number, line in enumerate(lines, 1)
            )
            + "\n"
            + (added if missing else "")
        )
    elif missing:
        appends[".gitignore"] = added
    settings = root / config
    current = yaml.safe_load(settings.read_text()) if settings.is_file() else None
    if not isinstance(current, dict) or "snakedvc" not in current:
        if settings.is_file() and current is not None and not isinstance(current, dict):
            raise InitError(f"{config} is not a mapping of keys: cannot add the snakedvc section to it")
        appends[config] = ("\n" if settings.is_file() else "") + CONFIG_SECTION
    return Plan(files=files, appends=appends, dvc_init=not (root / ".dvc").is_dir())


# Where init's lines keep outputs out of git but must leave these visible.
VISIBLE_PROBES = ("results/model.pt.dvc", "results/model/model.pt.dvc", "results/model/.gitignore")


def lines_hiding_dvc_files(lines: list[str], added: str) -> set[int]:
    """The numbers (from 1) of the user's .gitignore lines that would still hide a .dvc file under
    results/ after init's lines are added: e.g. ``results/``, which ignores the folder itself, so no
    later ``!`` line can bring a file inside it back. Asked of git, in a scratch repository."""
    import tempfile

    hiding: set[int] = set()
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(["git", "init", "-q", scratch], check=True, capture_output=True)
        for _ in range(len(lines) + 1):
            kept = ["" if number in hiding else line for number, line in enumerate(lines, 1)]
            Path(scratch, ".gitignore").write_text("\n".join(kept) + "\n" + added)
            proc = subprocess.run(
                ["git", "check-ignore", "-v", "-n", *VISIBLE_PROBES], cwd=scratch, capture_output=True, text=True
            )
            culprits = {
                int(found.split(":")[1])
                for found in proc.stdout.splitlines()
                if found.startswith(".gitignore:") and not found.split(":", 2)[2].startswith("!")
            }
            culprits = {number for number in culprits if number <= len(lines)} - hiding
            if not culprits:
                return hiding
            hiding |= culprits
    return hiding


def init(root: Path | str = ".", config: str = "config.yaml", dry_run: bool = False) -> list[str]:
    """Write what a project needs (see the module's docstring); returns what was (or would be) done."""
    base = Path(root).resolve()
    if not (base / ".git").exists():
        raise InitError(f"{base} is not the top of a git repository: run `git init` there first (DVC needs git)")
    todo = plan(base, config)
    if dry_run:
        return todo.describe()
    if todo.dvc_init:
        from snakedvc.engine.tracking import dvc_command

        proc = subprocess.run([*dvc_command(), "init", "--quiet"], cwd=base, capture_output=True, text=True)
        if proc.returncode != 0:
            raise InitError(f"dvc init failed in {base}:\n{proc.stderr.strip() or proc.stdout.strip()}")
    for path, text in todo.files.items():
        (base / path).parent.mkdir(parents=True, exist_ok=True)
        (base / path).write_text(text)
    for path, text in todo.appends.items():
        with open(base / path, "a") as handle:
            handle.write(text)
    return todo.describe()
