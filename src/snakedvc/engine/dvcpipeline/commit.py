"""What `dvc repro` does between stages, done on the submit host beside Snakemake's jobs.

One DVC repository object, held open in `snakedvc exp run`'s own process, commits the stages
that finished (dvc.lock, the cache) in batches: one pass of a loop commits every stage whose job
finished since the last, under the kit's lock and DVC's, with no process per commit. A stage
whose upstream stages run in this run waits in its job for a word from this loop, written once
every such upstream stage is committed (or skipped): run, if DVC found it changed at the start or
its dependencies came out changed; skip otherwise, as `dvc repro` skips it ("Stage 'x' didn't
change, skipping"); stop, if an upstream stage could not be committed. dvc.lock never records a
stage whose job did not finish.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from snakedvc.engine.dvcpipeline.plan import PipelineError, Plan
from snakedvc.engine.tracking import repo_lock

log = logging.getLogger(__name__)

# The words a waiting stage's job reads (snakedvc stage-run --decision).
RUN, SKIP, STOP, DEFER = "run", "skip", "stop", "defer"


def lock_keys(path: Path) -> set[str]:
    """The stage entries a dvc.lock has (none where there is no file)."""
    import yaml

    if not path.is_file():
        return set()
    return set((yaml.safe_load(path.read_text()) or {}).get("stages") or {})


def reorder_lock_entries(path: Path, order: Callable[[list[str]], list[str]]) -> bool:
    """dvc.lock's stage entries put in ``order`` (given the keys as they are) by moving their
    lines as DVC wrote them: a parse and a dump of the whole file take seconds at a thousand stages.
    False (nothing written) where the file is not the shape DVC writes: top-level keys, ``stages:``
    last, each entry a key indented by two spaces with its lines below it."""
    import yaml

    lines = path.read_text().splitlines(keepends=True)
    if "stages:\n" not in lines:
        return False
    start = lines.index("stages:\n") + 1
    entries: list[tuple[str, list[str]]] = []
    for line in lines[start:]:
        if line.startswith("  ") and not line.startswith("   ") and line.rstrip().endswith(":"):
            try:
                (key,) = yaml.safe_load(line.strip()) or {}
            except (yaml.YAMLError, ValueError, TypeError):
                return False
            entries.append((str(key), [line]))
        elif entries and (line.startswith("   ") or not line.strip()):
            entries[-1][1].append(line)
        else:  # a top-level line after the entries, or an entry of another indentation
            return False
    keys = [key for key, _ in entries]
    ordered = order(keys)
    if ordered == keys:
        return True
    if sorted(ordered) != sorted(keys):
        return False
    by_key = dict(entries)
    text = "".join(lines[:start]) + "".join(line for key in ordered for line in by_key[key])
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)
    return True


class Bookkeeper:
    """The commits and run-time decisions of one run's plan; ``step()`` is one pass, ``close()`` the last."""

    def __init__(self, plan: Plan, root: Path, repo: Any = None) -> None:
        self.plan, self.root = plan, root
        # An open DVC Repo of root to record through, the caller's (DVC's API reproduces through
        # the Repo it is called on: its stage objects, its run cache); None: one of its own.
        self._given_repo = repo
        self.committed: list[str] = []  # stages whose job finished, recorded in dvc.lock
        self.skipped: list[str] = []  # stages found unchanged at run time: not run, not recorded
        self.failed: dict[str, str] = {}  # stage -> why DVC could not commit it
        self._stopped: set[str] = set()
        self._decided: set[str] = set()
        self._seen: set[str] = set()
        self._stages: dict[str, Any] = {}
        self._waiting = [name for name in plan.run if plan.waits(name)]  # in DVC's order
        self._repo: Any = None
        self.first = plan  # the run's plan; ``plan`` is the pass's (next_pass)
        # stages that read another's file before it finished (path -> that stage), and those after
        # them: not recorded, run again in the next pass
        self.deferred: dict[str, dict[str, str]] = {}
        self.undeclared: dict[str, dict[str, str]] = {}  # every undeclared read seen, for the warning
        self._reran: set[str] = set()
        self.restored: list[str] = []  # stages whose outputs came from DVC's run cache: recorded, not run

    def __enter__(self) -> Bookkeeper:
        from dvc.repo import Repo

        # DVC's notes ("Generating lock file") would reach stdout, where exp run prints the name.
        self._dvc_level = logging.getLogger("dvc").level
        logging.getLogger("dvc").setLevel(max(self._dvc_level, logging.WARNING))
        with self._here():
            self._repo = self._given_repo or Repo(str(self.root))
            self._stages = {stage.addressing: stage for stage in self._repo.index.stages}
        self._keys_before = {path: lock_keys(path) for path in self._lock_files()}
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """The last pass (stages that finished since), then the repository closed."""
        if self._repo is None:
            return
        self.step()
        self._order_lock_files()
        if self._given_repo is None:
            self._repo.close()
        self._repo = None
        logging.getLogger("dvc").setLevel(self._dvc_level)

    def _lock_files(self) -> list[Path]:
        files = {Path(self.root, self._stages[name].dvcfile.path).with_suffix(".lock") for name in self.first.run}
        return sorted(file for file in files if file.name == "dvc.lock")

    def _order_lock_files(self) -> None:
        """dvc.lock's entries in the order `dvc repro` writes them: those it had before where they
        were, the new ones after, in DVC's order (the batches commit them as their jobs end)."""
        from dvc.utils.serialize import modify_yaml

        position = {self._stages[name].name: index for index, name in enumerate(self.first.run)}

        def order(keys: list[str], before: set[str]) -> list[str]:
            new = sorted((k for k in keys if k not in before), key=lambda k: position.get(k, len(position)))
            return [k for k in keys if k in before] + new

        with repo_lock(self.root):
            for path, before in self._keys_before.items():
                if not path.is_file() or reorder_lock_entries(path, functools.partial(order, before=before)):
                    continue
                with modify_yaml(str(path)) as data:  # a file of another shape than DVC writes
                    entries = data.get("stages") or {}
                    keys = list(entries)
                    ordered = order(keys, before)
                    if ordered != keys:
                        moved = [(key, entries[key]) for key in ordered]
                        entries.clear()
                        entries.update(moved)

    @contextlib.contextmanager
    def _here(self) -> Iterator[None]:
        # DVC names stages relative to the working directory ("sub/dvc.yaml:train" from elsewhere).
        with contextlib.chdir(self.root):
            yield

    def commit_unrun(self) -> None:
        """What `dvc repro` records without running it, before any job (the jobs read them):
        `dvc add`ed data that changed, frozen stages that changed; then the stages that start
        the run (none of their upstream stages runs) whose outputs DVC's run cache has for their
        inputs: restored, as `dvc repro` restores them, and not run."""
        for source in self.plan.data:
            log.info("%s changed: committed anew (as dvc repro does)", source)
        for frozen in self.plan.refresh:
            log.info("stage %s is frozen: recorded as it is, not run (as dvc repro does)", frozen)
        self._commit([*self.plan.data, *self.plan.refresh], fail=True)
        if self.plan.pull and self.plan.run_cache and self.plan.changed:
            self._pull_run_cache()
        # Only the stages whose jobs start at once: one that waits (one at a time, -s) keeps its
        # outputs until its turn, for the stages before it that may read them.
        for name in self.plan.changed:
            if not self.plan.waits_for(name) and self._restore(name):
                # Its job's output there before Snakemake starts: no job runs it, and the stages
                # after it find it finished.
                marker = self.root / self.plan.ran(name)
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()

    def _pull_run_cache(self) -> None:
        """--pull: DVC's run cache from the DVC remote first, as `dvc repro --pull` pulls it."""
        from dvc.repo import lock_repo
        from dvc.stage.cache import RunCacheNotSupported

        with repo_lock(self.root), self._here(), lock_repo(self._repo):
            try:
                self._repo.stage_cache.pull(None)
            except RunCacheNotSupported as error:  # DVC's words for it
                log.warning("Failed to pull run cache: %s", error)

    def _restore(self, name: str) -> bool:
        """DVC's run cache asked for the stage's outputs (``dvc repro``'s restore: the outputs
        checked out, the stage saved and committed); whether it had them."""
        if not self.plan.run_cache:
            return False
        from dvc.exceptions import DvcException
        from dvc.repo import lock_repo
        from dvc.stage.cache import RunCacheNotFoundError

        stage = self._stages[name]
        with repo_lock(self.root), self._here(), lock_repo(self._repo):
            try:  # as dvc repro: the outputs removed, then the cache asked (its job would remove them now)
                stage.remove_outs(ignore_remove=False, force=False)
                # As dvc repro calls it: with --pull, the entry and its outputs from the DVC remote too.
                self._repo.stage_cache.restore(stage, dry=False, **({"pull": True} if self.plan.pull else {}))
            except RunCacheNotFoundError:
                return False
            except (DvcException, OSError) as error:  # a missing dependency, a broken entry: the stage runs
                log.info("stage %s: not restored from DVC's run cache (%s): it runs", name, error)
                return False
        print(f"Stage '{name}' is cached - skipping run, checking out outputs", flush=True)  # DVC's line
        self.restored.append(name)
        self._commit([name])
        return True

    def step(self) -> None:
        """Commit the stages whose jobs finished since the last pass, then tell each waiting stage
        whose upstream stages are all settled whether to run."""
        ran_folder = (self.root / self.plan.ran(self.plan.run[0])).parent if self.plan.run else self.root
        markers = set(os.listdir(ran_folder)) if ran_folder.is_dir() else set()
        finished = [
            name for name in self.plan.run
            if name not in self._seen and self.plan.stage(name).rule in markers
        ]  # fmt: skip
        self._seen.update(finished)
        try:
            self._read_notes(finished)
            done = {*self.skipped, *self.deferred, *self.restored}
            self._commit([name for name in finished if name not in done])
            self._decide()
        except BaseException as error:  # no job waits for a word that will never come
            self.stop_waiting(f"the run's bookkeeping failed: {error!r}")
            raise

    def _read_notes(self, finished: list[str]) -> None:
        """What the finished stages' jobs noted of their reads (snakedvc.stage.ReadAudit)."""
        from snakedvc.stage import DEFERRED_FOLDER, UNDECLARED_FOLDER

        for name in finished:
            rule = self.plan.stage(name).rule
            for folder, into in ((UNDECLARED_FOLDER, self.undeclared), (DEFERRED_FOLDER, self.deferred)):
                note = self.root / self.plan.folder / folder / rule
                if note.is_file():
                    into.setdefault(name, {}).update(json.loads(note.read_text()))
            if name in self.deferred:
                self.undeclared.setdefault(name, {}).update(self.deferred[name])

    def next_pass(self) -> Plan | None:
        """After Snakemake's pass: the plan of the next one, of the stages deferred (in DVC's order,
        in a folder of its own), with this bookkeeper switched to it; None where none was."""
        if not self.deferred:
            return None
        again = [name for name in self.plan.run if name in self.deferred]
        read_early = [name for name in again if self.deferred[name]]  # run whatever: what they read changed
        number = sum(1 for _ in Path(self.root, self.first.folder).glob("pass*")) + 2
        plan = replace(
            self.plan, run=tuple(again), changed=tuple(n for n in again if n in self.plan.changed or n in read_early),
            folder=f"{self.first.folder}/pass{number}", data=(), refresh=(),
        )  # fmt: skip
        self.plan, self.deferred = plan, {}
        self._reran.update(read_early)
        self._seen, self._decided, self._stopped = set(), set(), set()
        self._waiting = [name for name in plan.run if plan.waits(name)]
        return plan

    def warn_undeclared(self) -> None:
        """The reads dvc.yaml does not declare, with the deps: lines that would (DVC never says)."""
        for name, found in self.undeclared.items():
            for path, writer in sorted(found.items()):
                log.warning(
                    "stage %r reads %s, which stage %r writes, without naming it in its deps%s; add it to dvc.yaml "
                    "(stages: %s: deps: - %s)%s",
                    name, path, writer,
                    f": it ran again after {writer!r}, as dvc repro's order has it" if name in self._reran else "",
                    name.split("@")[0].rpartition(":")[2], path,
                    "" if self.first.one_at_a_time else ", or run with --one-at-a-time",
                )  # fmt: skip

    def heartbeat_file(self) -> Path:
        """The file whose moves tell this run's waiting jobs that it is alive (stage.HEARTBEAT)."""
        from snakedvc.stage import HEARTBEAT

        return self.root / self.plan.folder / "decided" / HEARTBEAT  # beside the words (Plan.decision)

    def stop_waiting(self, why: str) -> None:
        """Every stage still waiting told to stop (the run is ending)."""
        for name in self.plan.run:
            if self.plan.waits(name) and name not in self._decided:
                self._tell(name, f"{STOP} {why}")

    def _commit(self, names: list[str], fail: bool = False) -> None:
        """One batch: each stage saved and committed (relink=False: the files its job wrote stay,
        so a job reading them now is never left without them), dvc.lock written once a file."""
        if not names:
            return
        from dvc.exceptions import DvcException
        from dvc.repo import lock_repo

        done: list[Any] = []
        with repo_lock(self.root), self._here(), lock_repo(self._repo):
            for name in names:
                stage = self._stages[name]
                try:
                    stage.save()
                    stage.commit(relink=False)
                except DvcException as error:
                    if fail:
                        raise PipelineError(f"{name}: DVC cannot record it: {error}") from error
                    self.failed[name] = str(error)
                    log.error("stage %s ran, but DVC cannot record it: %s", name, error)
                    continue
                done.append(stage)
            by_file: dict[str, list[Any]] = {}
            for stage in done:
                by_file.setdefault(stage.dvcfile.path, []).append(stage)
            for stages in by_file.values():
                stages[0].dvcfile.dump_stages(stages, update_pipeline=False)
        self.committed.extend(stage.addressing for stage in done if stage.addressing in self.plan.run)
        if done:
            log.info("committed to dvc.lock: %s", ", ".join(stage.addressing for stage in done))

    def _decide(self) -> None:
        settled = {*self.committed, *self.skipped}
        running = set(self.plan.run)
        for name in [name for name in self._waiting if name not in self._decided]:
            upstream = [up for up in self.plan.settles_after(name) if up in running]
            lost = [up for up in upstream if up in self.failed or up in self._stopped]
            again = [up for up in upstream if up in self.deferred]
            if again and not lost and all(up in settled or up in self.deferred for up in upstream):
                self.deferred[name] = {}
                self._tell(name, f"{DEFER} stage {again[0]!r} runs again (it read a file before the stage "
                           "writing it finished): this one runs after it")  # fmt: skip
            elif lost:
                self._stopped.add(name)
                self._tell(name, f"{STOP} stage {lost[0]!r} ran but could not be recorded (see the run's log)")
            elif all(up in settled for up in upstream):
                self._tell(name, RUN if self._must_run(name) else SKIP)

    def _must_run(self, name: str) -> bool:
        if name in self.plan.changed:
            return not self._restore(name)
        from dvc.exceptions import DvcException
        from dvc.repo import lock_repo

        stage = self._stages[name]
        # As dvc repro: with missing data allowed, a missing dependency still counts as changed
        # where the stage it comes from recorded other data for it (upstream: the stages it needs).
        upstream = list(self._repo.index.graph.successors(stage))
        with repo_lock(self.root), self._here(), lock_repo(self._repo):
            changed = bool(stage.changed(allow_missing=self.plan.allow_missing, upstream=upstream))
            if changed and self.plan.pull and not self.plan.allow_missing and not stage.changed(True, upstream):
                try:  # its only change is missing data: pulled, not run (dvc repro --pull)
                    log.info("Pulling data for %s", name)
                    self._repo.pull(name)
                    stage.checkout()
                    changed = False
                except DvcException as error:
                    log.info("Unable to pull data for %s (%s): it runs", name, error)
        if not changed:
            log.info("Stage '%s' didn't change, skipping", name)
            self.skipped.append(name)
        return changed and not self._restore(name)

    def _tell(self, name: str, word: str) -> None:
        self._decided.add(name)
        path = self.root / self.plan.decision(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(word + "\n")
        os.replace(partial, path)  # whole or absent, for a job polling a shared filesystem

    def experiment_hash(self) -> str:
        """The hash `dvc exp run` puts in its commit message: of the lock entries of the stages it
        recorded (DVC's own function)."""
        from dvc.repo.experiments.executor.base import BaseExecutor

        recorded = [*self.first.data, *self.first.refresh, *self.committed]
        return BaseExecutor.hash_exp(self._stages[name] for name in recorded)
