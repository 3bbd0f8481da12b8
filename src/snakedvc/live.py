"""Per-epoch metrics through dvclive, written by rank 0 of a training job, readable while it runs.

    log = EpochLog("results/live", main=ctx.is_main, params=hparams)
    start = resume.load(model, optimizer, extra=lambda: {"live": log.rows})
    log.restore(start.extra.get("live", []))  # a resumed job's epochs, as a straight run wrote them
    for epoch in ...:
        ...
        log.epoch(epoch, train_loss=..., valid_accuracy=...)  # one row per metric, flushed now
    log.finish(test_accuracy=...)

The files are dvclive's own layout (``metrics.json`` with the latest values and the epoch as
``step``, ``params.yaml``, ``plots/metrics/<name>.tsv``), so ``dvc exp show`` and ``dvc plots``
read them once the project's dvc.yaml lists the folder, and anything outside the job (``snakedvc
runs``, the VS Code extension, a person with ``cat``) sees every finished epoch. dvclive runs with
``save_dvc_exp=False`` and ``dvcyaml=False``: a rule's job never saves an experiment or edits
dvc.yaml (the workflow's controller records results in DVC).

dvclive is optional (``pip install snakedvc[live]``): only ``EpochLog`` needs it, and only on
rank 0; a project that logs otherwise never imports it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# dvclive's file names inside its folder.
METRICS_FILE = "metrics.json"
PARAMS_FILE = "params.yaml"
PLOTS_DIR = Path("plots") / "metrics"
# Touched in a run's workspace when its jobs begin: a dvclive folder written before that (DVC's
# checkout or --pull of an earlier experiment's outputs) is not this run's training.
JOBS_BEGAN = Path(".snakedvc") / "jobs-began"

Row = tuple[int, dict[str, float]]

__all__ = ["JOBS_BEGAN", "EpochLog", "Progress", "find_logs", "read_progress"]


class EpochLog:
    """dvclive on the main process, nothing on the others: ``main=False`` makes every call a no-op.

    ``rows`` is what was logged (epoch, metrics); keep it in a checkpoint and give it to
    ``restore`` after a resume, so the folder holds every epoch once, as a straight run's does.
    """

    rows: list[Row]

    def __init__(
        self, directory: str | os.PathLike[str], *, main: bool = True, params: Mapping[str, Any] | None = None
    ):
        self.directory = Path(directory)
        self.rows: list[Row] = []
        self._live: Any = None
        if not main:
            return
        try:
            live_class = _job_live_class()
        except ImportError as error:  # the kit does not force dvclive on projects that log otherwise
            raise ImportError(
                f"snakedvc.live.EpochLog writes dvclive's files ({self.directory}) but dvclive is not installed "
                "in this environment: pip install 'snakedvc[live]'"
            ) from error
        # A fresh folder: what a retried job left behind is replaced by restore(), not appended to.
        self._live = live_class(str(self.directory), save_dvc_exp=False, dvcyaml=False, report=None)
        if params:
            self._live.log_params(dict(params))

    def restore(self, rows: Iterable[Row | list[Any]]) -> None:
        """Write again the epochs of a checkpoint this job resumed from (their order kept): the
        rows appended, the summary written once at the end (a long run resumes in seconds)."""
        for epoch, metrics in rows:
            values = {name: float(value) for name, value in metrics.items()}
            self.rows.append((int(epoch), values))
            if self._live is not None:
                self._live.step = int(epoch)
                for name, value in values.items():
                    self._live.log_metric(name, value)
        if self._live is not None and self.rows:
            self._live.make_summary()
            self._live.step = self.rows[-1][0] + 1

    def epoch(self, epoch: int, **metrics: float) -> None:
        """One epoch's metrics, on disk when this returns (metrics.json's ``step`` is ``epoch``)."""
        values = {name: float(value) for name, value in metrics.items()}
        self.rows.append((epoch, values))
        if self._live is None:
            return
        self._live.step = epoch
        for name, value in values.items():
            self._live.log_metric(name, value)
        self._live.next_step()

    def finish(self, **final: float) -> None:
        """End the log; ``final`` values (a test metric, say) go into metrics.json beside the last epoch's."""
        if self._live is None:
            return
        for name, value in final.items():
            self._live.log_metric(name, float(value), plot=False)
        if self.rows:
            self._live.step = self.rows[-1][0]  # end() rewrites metrics.json: keep the last epoch as step
        self._live.end()
        self._live = None


def _job_live_class() -> type:
    """dvclive's Live as a rule's job needs it: the same files, at a constant cost per epoch.

    Two public methods are overridden. ``post_data_to_studio``: dvclive re-reads every metric's
    whole .tsv at each step to build a Studio update, even with Studio off, so a run of N epochs
    costs O(N²) (2000 epochs: 5.9 s, growing); jobs do not post to Studio (compute nodes often
    have no network: the files are what dvc, VS Code and `snakedvc runs` read). ``next_step``:
    without the VS Code signal file that dvclive rewrites and fsyncs in .dvc/tmp at every step
    (it serves experiments queued by `dvc exp run`, which a Snakemake job is not).
    """
    from dvclive import Live

    class JobLive(Live):
        def post_data_to_studio(self) -> None:
            return None

        def next_step(self) -> None:
            self.sync()
            self.step += 1

    return JobLive


@dataclass(frozen=True)
class Progress:
    """Where a training stands, as its dvclive folder says."""

    directory: Path
    epoch: int
    metrics: dict[str, Any]
    updated: float  # when metrics.json was last written (epoch seconds)

    def describe(self, now: float | None = None, limit: int = 2) -> str:
        shown = [(k, v) for k, v in self.metrics.items() if isinstance(v, int | float)][:limit]
        values = " ".join(f"{k} {v:.4g}" for k, v in shown)
        age = max(0.0, (now if now is not None else time.time()) - self.updated)
        return f"epoch {self.epoch}" + (f" {values}" if values else "") + f" ({_age(age)} ago)"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


def read_progress(directory: str | os.PathLike[str]) -> Progress | None:
    """The latest epoch and metrics in a dvclive folder, or None if it has none yet.

    metrics.json is rewritten in place every epoch: a read that catches it half-written is retried.
    """
    path = Path(directory) / METRICS_FILE
    for _ in range(5):
        try:
            updated = path.stat().st_mtime
            summary = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            time.sleep(0.05)
            continue
        if not isinstance(summary, dict) or "step" not in summary:
            return None
        metrics = {k: v for k, v in summary.items() if k != "step"}
        return Progress(Path(directory), int(summary["step"]), metrics, updated)
    return None


def find_logs(root: str | os.PathLike[str], skip: Iterable[str] = (".git", ".snakemake", ".dvc")) -> Iterator[Path]:
    """dvclive folders under root (a metrics.json beside plots/metrics), newest write first."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        if METRICS_FILE in files and (Path(folder) / PLOTS_DIR).is_dir():
            found.append(Path(folder))
    found.sort(key=lambda p: (p / METRICS_FILE).stat().st_mtime, reverse=True)
    yield from found
