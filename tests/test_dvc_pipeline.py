"""`snakedvc exp run`: a project's own dvc.yaml, every stage a Snakemake job, recorded as `dvc exp run` records it.

Each test writes a DVC project of its own (no Snakefile), clones it twice, runs `dvc exp run` in
one clone and `snakedvc exp run` in the other with the same `-S`, and compares what DVC keeps:
the outputs' bytes, dvc.lock, the experiment's params and metrics in `dvc exp show --json`, and
`dvc status` after both.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from snakedvc.engine.dvcpipeline import PipelineError, kit_profile, pipeline_profile, read_plan
from snakedvc.engine.dvcpipeline.run import STOP_WAIT_S
from snakedvc.engine.names import experiment_ref
from tests.conftest import git, running_rule_jobs, slurm_jobs_by_rule
from tests.test_tutorial import BIN, ENV, run
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

# (a) a three-stage chain, (b) a foreach of 3 items feeding a matrix, (c) params from params.yaml
# and a second file, (d) vars, ${...} templating and a wdir.
PARAMS = {"prepare": {"n": 5}, "train": {"lr": 0.1, "epochs": 3}, "items": ["a", "b", "c"]}
MORE_PARAMS = {"scale": 2}
DVC_YAML = """\
vars:
  - folder: out
  - more.yaml:scale
stages:
  prepare:
    cmd: mkdir -p ${folder} && python3 -c "import sys; print(*range(${prepare.n}))" > ${folder}/data.txt
    params:
      - prepare.n
    outs:
      - ${folder}/data.txt
  featurize:
    foreach: ${items}
    do:
      cmd: sleep 3 && python3 -c "print(open('${folder}/data.txt').read().strip(), '${item}')" > ${folder}/feat-${item}.txt
      deps:
        - ${folder}/data.txt
      outs:
        - ${folder}/feat-${item}.txt
  combine:
    matrix:
      left: [a, b]
      right: [c]
    cmd: cat ${folder}/feat-${item.left}.txt ${folder}/feat-${item.right}.txt > ${folder}/pair-${item.left}${item.right}.txt
    deps:
      - ${folder}/feat-${item.left}.txt
      - ${folder}/feat-${item.right}.txt
    outs:
      - ${folder}/pair-${item.left}${item.right}.txt
  train:
    wdir: ${folder}
    cmd:
      - python3 -c "print(${train.lr} * ${train.epochs} * ${scale})" > model.txt
      - cat pair-ac.txt pair-bc.txt >> model.txt
    deps:
      - pair-ac.txt
      - pair-bc.txt
    params:
      - ../params.yaml:
          - train
      - ../more.yaml:
          - scale
    outs:
      - model.txt
  evaluate:
    cmd: python3 -c "import json; print(json.dumps(dict(size=len(open('out/model.txt').read()))))" > metrics.json
    deps:
      - out/model.txt
    metrics:
      - metrics.json:
          cache: false
"""


# The jobs' sizes, beside dvc.yaml (dvc exp run ignores the file). train runs through snakedvc launch.
# Runtimes above the SLURM profile's pack-runtime (5 min): on the cluster each stage is a job of its
# own (tests/test_slurm_packing.py packs short ones).
RESOURCES = """\
resources:
  "*": {runtime: 10, mem: 300MB}
  featurize@*: {cpus: 1}
  train: {cpus: 2, mem: 1GB, runtime: 1h, launch: true}
"""


def dvc(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(cwd, str(BIN / "dvc"), *args, check=check)


def snakedvc(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(cwd, str(BIN / "snakedvc"), *args, check=check)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return dvc_project(
        tmp_path / "origin",
        {"params.yaml": yaml.safe_dump(PARAMS), "more.yaml": yaml.safe_dump(MORE_PARAMS), "dvc.yaml": DVC_YAML,
         "snakedvc.yaml": RESOURCES},
    )  # fmt: skip


def dvc_project(origin: Path, files: dict[str, str]) -> Path:
    """A git + DVC repository holding ``files``, committed."""
    origin.mkdir()
    git(origin, "init", "-q", "-b", "main")
    for name, text in files.items():
        (origin / name).parent.mkdir(parents=True, exist_ok=True)
        (origin / name).write_text(text)
    dvc(origin, "init", "-q")
    git(origin, "add", "-A")
    git(origin, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "a DVC pipeline")
    return origin


def clone(origin: Path, name: str) -> Path:
    target = origin.parent / name
    git(origin.parent, "clone", "-q", str(origin), str(target))
    git(target, "config", "user.name", "a")
    git(target, "config", "user.email", "a@b")
    return target


def outputs(repo: Path) -> dict[str, str]:
    files = [p for p in (repo / "out").rglob("*") if p.is_file() and p.name != ".gitignore"] + [repo / "metrics.json"]
    return {str(p.relative_to(repo)): hashlib.md5(p.read_bytes()).hexdigest() for p in files}


def experiment(repo: Path, name: str) -> dict:
    shown = json.loads(dvc(repo, "exp", "show", "--json").stdout)
    for baseline in shown:
        for exp in baseline.get("experiments") or []:
            for rev in exp["revs"]:
                if rev["name"] == name:
                    return {"params": rev["data"]["params"], "metrics": rev["data"]["metrics"]}
    raise AssertionError(f"no experiment {name} in {shown}")


def lock(repo: Path) -> dict:
    return yaml.safe_load((repo / "dvc.lock").read_text())


def test_exp_run_records_what_dvc_exp_run_records(project: Path) -> None:
    by_dvc, by_kit = clone(project, "by-dvc"), clone(project, "by-kit")
    dvc(by_dvc, "exp", "run", "-S", "train.lr=0.3", "-S", "more.yaml:scale=3", "-n", "same")
    out = snakedvc(by_kit, "exp", "run", "-S", "train.lr=0.3", "-S", "more.yaml:scale=3", "-n", "same")
    assert out.stdout.splitlines()[-2:] == [
        "Ran experiment(s): same",
        "Experiment results have been applied to your workspace.",
    ]
    assert (
        "stage_train" not in out.stdout + out.stderr and "Building DAG" not in out.stdout + out.stderr
    )  # no Snakemake
    assert "featurize@a| " in out.stdout or "Running stage 'featurize@a':" in out.stdout  # side by side: prefixed
    assert outputs(by_kit) == outputs(by_dvc) and len(outputs(by_kit)) == 8
    # The same bytes, entries in DVC's order though the batches commit them as their jobs end; and
    # DVC's commit message, whose hash is of the recorded stages' lock entries.
    assert (by_kit / "dvc.lock").read_text() == (by_dvc / "dvc.lock").read_text()
    subject = ["log", "-1", "--format=%s"]
    assert git(by_kit, *subject, experiment_ref("same", by_kit)) == git(
        by_dvc, *subject, experiment_ref("same", by_dvc)
    )
    assert experiment(by_kit, "same") == experiment(by_dvc, "same")
    assert experiment(by_kit, "same")["params"]["more.yaml"]["data"] == {"scale": 3}
    for repo in (by_dvc, by_kit):
        assert "up to date" in dvc(repo, "status").stdout
    # The kit's bookkeeping stays out of git status, as DVC's own does: the two clones look alike.
    assert git(by_kit, "status", "--porcelain") == git(by_dvc, "status", "--porcelain")
    # One job per stage and per foreach/matrix item: 1 + 3 + 2 + 1 + 1.
    plan_folder = next((by_kit / ".snakedvc/pipeline").iterdir())
    assert len(list((plan_folder / "ran").iterdir())) == 8

    # Nothing changed: no job. One param changed: the stages `dvc repro` runs (measured: `dvc repro
    # --dry` lists only 'train', the stage whose param changed; the real run goes on to 'evaluate',
    # whose input train then changes).
    # Nothing changed: no job runs, and the experiment is saved all the same, as `dvc exp run` saves one.
    ran = len(list((by_kit / ".snakedvc/pipeline").glob("*/ran/*")))
    by_kit_again = re.search(r"Ran experiment\(s\): (\S+)", snakedvc(by_kit, "exp", "run").stdout)
    by_dvc_again = re.search(r"Ran experiment\(s\): (\S+)", dvc(by_dvc, "exp", "run").stdout)
    assert by_dvc_again and by_kit_again and by_kit_again[1] != "same"
    again = by_kit_again[1]
    assert experiment(by_kit, again) == experiment(by_dvc, by_dvc_again[1]) == experiment(by_kit, "same")
    assert len(list((by_kit / ".snakedvc/pipeline").glob("*/ran/*"))) == ran  # no stage ran
    assert git(by_kit, "status", "--porcelain") == git(by_dvc, "status", "--porcelain")
    for repo in (by_dvc, by_kit):
        (repo / "params.yaml").write_text(yaml.safe_dump({**PARAMS, "train": {"lr": 0.3, "epochs": 4}}))
    assert list(read_plan(by_kit, "x").run) == ["train", "evaluate"]
    ran = re.findall(r"Running stage '([^']+)'", dvc(by_dvc, "repro").stdout)
    assert ran == ["train", "evaluate"]
    plans = len(list((by_kit / ".snakedvc/pipeline").iterdir()))
    taken = snakedvc(by_kit, "exp", "run", "-n", "same", check=False)
    assert taken.returncode == 255 and "experiment 'same' exists already" in taken.stderr
    assert len(list((by_kit / ".snakedvc/pipeline").iterdir())) == plans  # refused before any job
    snakedvc(by_kit, "exp", "run", "-n", "second")
    assert outputs(by_kit) == outputs(by_dvc) and lock(by_kit) == lock(by_dvc)


def test_targets_run_what_dvc_runs_for_them(project: Path) -> None:
    by_dvc, by_kit = clone(project, "by-dvc"), clone(project, "by-kit")
    for repo in (by_dvc, by_kit):
        dvc(repo, "repro", "--quiet")
        (repo / "params.yaml").write_text(yaml.safe_dump({**PARAMS, "prepare": {"n": 6}}))
    plan = read_plan(by_kit, "x", targets=["combine@b-c"]).run
    params = (by_kit / "params.yaml").read_text()
    dry = snakedvc(by_kit, "exp", "run", "--dry", "-S", "prepare.n=7", "combine@b-c").stdout.split()
    assert dry == list(plan) and (by_kit / "params.yaml").read_text() == params  # dry: no file changed
    refused = snakedvc(by_kit, "exp", "run", "--", "--dry-run", check=False)
    assert refused.returncode == 255 and "a dry run is `snakedvc exp run --dry`" in refused.stderr
    ran = re.findall(r"Running stage '([^']+)'", dvc(by_dvc, "exp", "run", "-n", "pair", "combine@b-c").stdout)
    snakedvc(by_kit, "exp", "run", "-n", "pair", "combine@b-c")
    assert sorted(plan) == sorted(ran) == ["combine@b-c", "featurize@b", "featurize@c", "prepare"]
    assert plan[0] == "prepare" and plan[-1] == "combine@b-c"
    assert lock(by_kit) == lock(by_dvc) and experiment(by_kit, "pair") == experiment(by_dvc, "pair")
    # A foreach stage's name stands for its items: only featurize@a is left to run.
    assert read_plan(by_kit, "x", targets=["featurize"]).run == ("featurize@a",)
    unknown = snakedvc(by_kit, "exp", "run", "trian", check=False)
    assert unknown.returncode == 255 and "Stage 'trian' not found inside 'dvc.yaml' file" in unknown.stderr


def test_frozen_and_always_changed_stages_run_as_dvc_runs_them(project: Path) -> None:
    by_dvc, by_kit = clone(project, "by-dvc"), clone(project, "by-kit")
    flagged = DVC_YAML.replace("  prepare:\n", "  prepare:\n    frozen: true\n").replace(
        "  evaluate:\n", "  evaluate:\n    always_changed: true\n"
    )
    for repo in (by_dvc, by_kit):
        dvc(repo, "repro", "--quiet")
        (repo / "dvc.yaml").write_text(flagged)
        (repo / "params.yaml").write_text(yaml.safe_dump({**PARAMS, "prepare": {"n": 6}}))
    # prepare's param changed but it is frozen; evaluate's inputs did not change but it always runs.
    ran = re.findall(r"Running stage '([^']+)'", dvc(by_dvc, "exp", "run", "-n", "flags").stdout)
    plan = read_plan(by_kit, "x")
    assert ran == list(plan.run) == ["evaluate"] and plan.refresh == ("prepare",)  # its lock entry renewed
    snakedvc(by_kit, "exp", "run", "-n", "flags")
    assert lock(by_kit) == lock(by_dvc) and experiment(by_kit, "flags") == experiment(by_dvc, "flags")


def test_submitted_runs_at_once_each_end_in_their_own_experiment(project: Path) -> None:
    by_dvc, by_kit = clone(project, "by-dvc"), clone(project, "by-kit")
    for repo in (by_dvc, by_kit):
        dvc(repo, "repro", "--quiet")  # up to date, dvc.lock not committed: the runs start from here
    params = (by_kit / "params.yaml").read_text()
    runs = {
        lr: snakedvc(by_kit, "submit", "--name", f"lr{lr}", "-S", f"train.lr=0.{lr}").stdout.strip() for lr in (2, 4)
    }
    # Every run ended before DVC reads the experiments: `dvc exp show` during another run's save
    # fails in DVC ("unknown Git revision 'refs/exps/exec/EXEC_BASELINE'": the save's ref, for a moment).
    ended_runs = {
        lr: wait_until(lambda run_id=run_id: ended_run(by_kit, run_id), f"run {run_id} to end", 300, poll=1)
        for lr, run_id in runs.items()
    }
    for lr, run_id in runs.items():
        ended = ended_runs[lr]
        assert ended["state"] == "done" and ended["experiments"] == [f"lr{lr}"], snakedvc(by_kit, "logs", run_id).stdout
        # The workspace had the outputs at submit (from DVC's cache): only the stages -S changed ran.
        markers = (by_kit / ".snakedvc/runs" / run_id / "workspace/.snakedvc/pipeline").glob("*/ran/*")
        assert sorted(marker.name for marker in markers) == ["stage_evaluate", "stage_train"]
        dvc(by_dvc, "exp", "run", "-S", f"train.lr=0.{lr}", "-n", f"lr{lr}")
        assert experiment(by_kit, f"lr{lr}") == experiment(by_dvc, f"lr{lr}")
        assert yaml.safe_load(git(by_kit, "show", f"{experiment_rev(by_kit, f'lr{lr}')}:dvc.lock")) == lock(by_dvc)
    assert (by_kit / "params.yaml").read_text() == params  # each run changed its own workspace's copy


def test_a_second_exp_run_in_one_workspace_is_refused_and_changes_nothing(project: Path) -> None:
    repo = clone(project, "busy")
    first = subprocess.Popen(
        [str(BIN / "snakedvc"), "exp", "run"], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(
            lambda: list((repo / ".snakedvc/pipeline").glob("*/plan.json")), "the first run's jobs", 60, proc=first
        )
        second = snakedvc(repo, "exp", "run", "-S", "train.lr=0.9", check=False)
        assert second.returncode == 255 and "another snakedvc exp run is running in" in second.stderr
        assert "0.9" not in (repo / "params.yaml").read_text()
    finally:
        _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr


def experiment_rev(repo: Path, name: str) -> str:
    refs = git(repo, "for-each-ref", "--format=%(objectname) %(refname)", "refs/exps").splitlines()
    return next(rev for rev, ref in (line.split() for line in refs) if ref.endswith(f"/{name}"))


def ended_run(repo: Path, run_id: str) -> dict | None:
    listed = {run["id"]: run for run in json.loads(snakedvc(repo, "runs", "--json").stdout)}
    return listed[run_id] if listed[run_id]["state"] not in ("queued", "running") else None


def test_a_failing_stage_names_itself_and_keeps_the_stages_before_it(project: Path) -> None:
    repo = clone(project, "failing")
    (repo / "params.yaml").write_text(yaml.safe_dump({**PARAMS, "train": {"lr": "oops", "epochs": 3}}))
    proc = snakedvc(repo, "exp", "run", check=False)
    assert proc.returncode == 255  # as dvc exp run exits on an error
    assert "Error in rule stage_train" not in proc.stdout + proc.stderr  # Snakemake's lines only with -v
    assert "Running stage 'train':" in proc.stdout and "> python3 -c" in proc.stdout  # as DVC shows a stage
    log = re.search(r"stage 'train' failed: its log is (\S+) ", proc.stderr)
    assert log and "oops" in (repo / log.group(1)).read_text(), proc.stderr  # the command's own error
    assert "its command: python3 -c" in proc.stderr
    assert "Committed to dvc.lock: prepare" in proc.stderr and "no experiment was saved" in proc.stderr
    committed = set(lock(repo)["stages"])
    assert {"prepare", "featurize@a", "combine@a-c"} <= committed and "train" not in committed
    assert not (repo / "out/model.txt").exists() or "train" not in committed


def test_a_pipeline_that_cannot_run_is_refused_before_any_job_or_param_change(project: Path) -> None:
    repo = clone(project, "refused")
    params = (repo / "params.yaml").read_text()

    def refused(*needles: str) -> None:
        proc = snakedvc(repo, "exp", "run", "-S", "train.lr=0.5", check=False)
        assert proc.returncode == 255 and all(needle in proc.stderr for needle in needles), proc.stderr
        assert (repo / "params.yaml").read_text() == params and not (repo / "out").exists()

    text = DVC_YAML.replace("      - model.txt\n", "      - model.txt:\n          persist: true\n")
    (repo / "dvc.yaml").write_text(text)
    with pytest.raises(PipelineError, match=r"stage 'train', output 'model.txt': persist"):
        read_plan(repo, "x")
    refused("stage 'train', output 'model.txt': persist")
    (repo / "dvc.yaml").write_text(DVC_YAML + "   broken: [\n")
    refused("dvc.yaml: DVC cannot read the pipeline", "line 51")  # YAML's own message, with the line
    (repo / "dvc.yaml").write_text(DVC_YAML)
    (repo / "snakedvc.yaml").write_text("resources:\n  trian: {cpus: 2}\n")
    refused("snakedvc.yaml: resources entry 'trian' matches no stage of dvc.yaml")
    typo = snakedvc(repo, "exp", "run", "--profile", "slrum", check=False)
    assert typo.returncode == 255 and "profile 'slrum': no config.yaml in" in typo.stderr
    # A bare name is the project's profiles/<name> where it has one (as `snakedvc init` writes it),
    # else the kit's: a cluster's own partitions are never passed over for the kit's.
    assert pipeline_profile("slurm", repo) == kit_profile("slurm")
    (repo / "profiles/slurm").mkdir(parents=True)
    (repo / "profiles/slurm/config.yaml").write_text("executor: snakedvc-slurm\n")
    assert pipeline_profile("slurm", repo) == repo / "profiles/slurm"
    assert pipeline_profile("profiles/slurm", repo) == repo / "profiles/slurm"


def accounted(ids: list[str], steps: bool = False) -> dict[str, dict[str, str]]:
    """sacct's record of these jobs (and their steps): CPUs, memory, time limit, start and end."""
    names = ("id", "cpus", "mem", "limit", "start", "end")
    out = subprocess.run(
        ["sacct", "-n", "-P", *([] if steps else ["-X"]), "-j", ",".join(ids), "-o",
         "JobID,AllocCPUS,ReqMem,Timelimit,Start,End"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {row["id"]: row for row in (dict(zip(names, line.split("|"), strict=True)) for line in out.splitlines())}


@pytest.mark.slurm
def test_exp_run_on_the_test_cluster_runs_a_job_per_stage(project: Path, slurm_cluster: None) -> None:
    by_dvc, by_kit = clone(project, "by-dvc"), clone(project, "by-kit")
    changes = ["-S", "train.lr=0.3", "-S", "more.yaml:scale=3"]  # both params files
    dvc(by_dvc, "exp", "run", *changes, "-n", "cluster")
    # The kit's profile; -v: Snakemake's lines, which name the jobs
    proc = snakedvc(by_kit, "exp", "run", "-v", "--profile", "slurm", *changes, "-n", "cluster")
    # One SLURM job per stage and per foreach/matrix item; the commits ran on the submit host.
    jobs = slurm_jobs_by_rule(proc.stdout + proc.stderr)
    assert sorted(jobs) == sorted(
        f"stage_{name}" for name in ("prepare", "featurize_a", "featurize_b", "featurize_c", "combine_a_c",
                                     "combine_b_c", "train", "evaluate")
    ) and all(len(ids) == 1 for ids in jobs.values()), jobs  # fmt: skip
    assert outputs(by_kit) == outputs(by_dvc)
    assert lock(by_kit) == lock(by_dvc)
    assert experiment(by_kit, "cluster") == experiment(by_dvc, "cluster")
    assert experiment(by_kit, "cluster")["params"]["more.yaml"]["data"] == {"scale": 3}
    assert "up to date" in dvc(by_kit, "status").stdout

    # Each job sized by snakedvc.yaml (RESOURCES); train's command ran as a job step (launch).
    jobs_of = {rule: ids[0] for rule, ids in jobs.items()}
    sizes = accounted(list(jobs_of.values()))
    assert [sizes[jobs_of["stage_train"]][key] for key in ("cpus", "mem", "limit")] == ["2", "1000M", "01:00:00"]
    assert [sizes[jobs_of["stage_featurize_b"]][key] for key in ("cpus", "mem", "limit")] == ["1", "300M", "00:10:00"]
    assert f"{jobs_of['stage_train']}.0" in accounted([jobs_of["stage_train"]], steps=True)
    # The foreach items ran at the same time: each started before any of them ended.
    items = [sizes[jobs_of[f"stage_featurize_{item}"]] for item in "abc"]
    assert max(item["start"] for item in items) < min(item["end"] for item in items), items


@pytest.mark.slurm
def test_a_stage_cancelled_by_scancel_fails_the_run_naming_it(tmp_path: Path, slurm_cluster: None) -> None:
    stages = {"stages": {
        "first": {"cmd": "echo 1 > first.txt", "outs": ["first.txt"]},
        "second": {"cmd": "sleep 300 && echo 2 > second.txt", "deps": ["first.txt"], "outs": ["second.txt"]},
    }}  # fmt: skip
    repo = clone(dvc_project(tmp_path / "origin", {"dvc.yaml": yaml.safe_dump(stages)}), "cancelled")
    run = subprocess.Popen(
        [str(BIN / "snakedvc"), "exp", "run", "--profile", str(kit_profile("slurm")), "--", "--retries", "0"],
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        job = wait_until(
            lambda: next(iter(running_rule_jobs("stage_second", repo)), None),
            "stage second's job running",
            180,
            proc=run,
        )
        subprocess.run(["scancel", job], check=True)
        _, stderr = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 255
    log = re.search(r"stage 'second' failed: its log is (\S+) \(its command: sleep 300 && echo 2", stderr)
    assert log and (repo / log.group(1)).exists(), stderr
    assert "Committed to dvc.lock: first; no experiment was saved" in stderr
    assert set(lock(repo)["stages"]) == {"first"}


# A second pipeline in a subfolder that never ran: its dependency does not even exist.
NEVER_RUN = """\
stages:
  unrun:
    cmd: cp missing.txt copied.txt
    deps: [missing.txt]
    outs: [copied.txt]
"""


def test_a_never_run_pipeline_in_a_subfolder_is_neither_run_nor_committed(tmp_path: Path) -> None:
    files = {"params.yaml": yaml.safe_dump(PARAMS), "more.yaml": yaml.safe_dump(MORE_PARAMS), "dvc.yaml": DVC_YAML}
    origin = dvc_project(tmp_path / "origin", {**files, "other/dvc.yaml": NEVER_RUN})
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")
    dvc(by_dvc, "exp", "run", "-n", "mine")
    snakedvc(by_kit, "exp", "run", "-n", "mine")
    assert outputs(by_kit) == outputs(by_dvc) and lock(by_kit) == lock(by_dvc)
    for repo in (by_dvc, by_kit):
        assert not (repo / "other/copied.txt").exists() and not (repo / "other/dvc.lock").exists()
        ref = next(
            r for r in git(repo, "for-each-ref", "--format=%(refname)", "refs/exps").split() if r.endswith("/mine")
        )
        assert git(repo, "diff", "--name-only", "HEAD", ref, "--", "other").strip() == ""
    assert experiment(by_kit, "mine") == experiment(by_dvc, "mine")


ENV_STAGE = """\
stages:
  train:
    cmd: echo "$OMP_NUM_THREADS|$MKL_NUM_THREADS|$DVC_EXP_NAME|$DVC_EXP_BASELINE_REV|$([ "$DVC_ROOT" = "$PWD" ] && echo root)" > out/deep/seen.txt
    params: [train.lr]
    outs: [out/deep/seen.txt]
"""


def test_a_stage_sees_what_dvc_exp_run_gives_it_and_errors_are_dvcs(tmp_path: Path) -> None:
    """The folder of an output made before the command (DVC makes it), DVC_EXP_NAME,
    DVC_EXP_BASELINE_REV and DVC_ROOT set, the thread variables as the user has them (not Snakemake's
    OMP_NUM_THREADS=<threads>): the stage writes the same bytes both ways. A stage whose cpus
    snakedvc.yaml gives gets them as its limit. A bad -S says what DVC says, with DVC's exit code."""
    origin = dvc_project(tmp_path / "origin", {"params.yaml": "train:\n  lr: 0.1\n", "dvc.yaml": ENV_STAGE})
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")
    env = {**ENV, "OMP_NUM_THREADS": "7"}
    env.pop("MKL_NUM_THREADS", None)

    def both(*args: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
        return tuple(
            subprocess.run([str(BIN / tool), "exp", "run", *args], cwd=repo, env=env, capture_output=True, text=True)
            for tool, repo in (("dvc", by_dvc), ("snakedvc", by_kit))
        )  # type: ignore[return-value]

    named = both("-n", "seen", "-S", "train.lr=0.2")
    assert [p.returncode for p in named] == [0, 0], named[1].stderr[-2000:]
    head = git(origin, "rev-parse", "HEAD").strip()
    seen = (by_kit / "out/deep/seen.txt").read_text()
    assert seen == (by_dvc / "out/deep/seen.txt").read_text() == f"7||seen|{head}|root\n"
    assert lock(by_kit) == lock(by_dvc)

    # No -n: DVC's kind of random name, chosen before the stage ran, the one the experiment gets.
    (unnamed,) = both("-S", "train.lr=0.3")[1:]
    said = re.search(r"Ran experiment\(s\): (\S+)", unnamed.stdout)
    assert said and re.fullmatch(r"[a-z]+-[a-z]+", said[1]), unnamed.stdout
    name = said[1]
    assert (by_kit / "out/deep/seen.txt").read_text() == f"7||{name}|{head}|root\n"
    assert experiment(by_kit, name)["params"]["params.yaml"]["data"]["train"]["lr"] == 0.3

    # cpus in snakedvc.yaml: the job's thread limit, as for a Snakefile rule with threads.
    (by_kit / "snakedvc.yaml").write_text("resources:\n  train: {cpus: 2}\n")
    snakedvc(by_kit, "exp", "run", "-S", "train.lr=0.4")
    assert (by_kit / "out/deep/seen.txt").read_text().startswith("2|2|")

    bad = both("-S", "train.lrr=0.1")
    assert [p.returncode for p in bad] == [255, 255]
    assert "To append to your config use +train.lrr=0.1" in bad[0].stderr
    assert "To append to your config use +train.lrr=0.1" in bad[1].stderr, bad[1].stderr


CACHED_METRICS = """\
stages:
  evaluate:
    cmd:
      - mkdir -p eval/plots
      - echo '{"score":${train.lr}}' > eval/metrics.json
      - printf 'x,y\\n1,2\\n' > eval/plots/p.csv
    params: [train.lr]
    outs: [eval]
metrics: [eval/metrics.json]
plots: [eval/plots]
"""


def test_the_experiment_commit_holds_what_dvc_exp_runs_holds_and_its_branch_reproduces(tmp_path: Path) -> None:
    """A cached output folder whose files dvc.yaml's top-level metrics and plots name: `dvc exp save`
    force-added them to git, `dvc exp run`'s commit never has them; on a branch of that
    experiment `dvc repro` then refused ("output 'eval' is already tracked by SCM")."""
    origin = dvc_project(tmp_path / "origin", {"params.yaml": "train:\n  lr: 0.1\n", "dvc.yaml": CACHED_METRICS})
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")
    dvc(by_dvc, "exp", "run", "-n", "kept", "-S", "train.lr=0.2")
    snakedvc(by_kit, "exp", "run", "-n", "kept", "-S", "train.lr=0.2")

    def committed(repo: Path) -> set[str]:
        ref = experiment_ref("kept", repo)
        assert ref, "no experiment 'kept'"
        return set(git(repo, "ls-tree", "-r", "--name-only", ref).split())

    assert committed(by_kit) == committed(by_dvc)
    assert "eval/metrics.json" not in committed(by_kit) and "dvc.lock" in committed(by_kit)
    assert experiment(by_kit, "kept") == experiment(by_dvc, "kept")
    dvc(by_kit, "exp", "branch", "kept", "from-kept")
    git(by_kit, "checkout", "-q", "-f", "from-kept")  # -f: the workspace holds the run's dvc.lock, untracked
    reproduced = dvc(by_kit, "repro", check=False)
    assert reproduced.returncode == 0 and "already tracked by SCM" not in reproduced.stderr, reproduced.stderr


def test_a_project_whose_script_shares_a_standard_modules_name_runs(tmp_path: Path) -> None:
    """DVC's own tests keep a copy.py beside dvc.yaml. `python -m snakemake` in that folder put it
    first on sys.path, and Snakemake's `import copy` ran it (found by scripts/dvc-suite)."""
    copy_py = "import shutil, sys\nshutil.copyfile(sys.argv[1], sys.argv[2])\n"
    stages = {
        "stages": {"copy": {"cmd": "python3 copy.py data copied", "deps": ["data", "copy.py"], "outs": ["copied"]}}
    }
    origin = dvc_project(
        tmp_path / "origin", {"copy.py": copy_py, "data": "bytes\n", "dvc.yaml": yaml.safe_dump(stages)}
    )
    repo = clone(origin, "kit")
    snakedvc(repo, "exp", "run", "-n", "copied")
    assert (repo / "copied").read_text() == "bytes\n"
    # -f runs what is up to date, as `dvc exp run -f` does.
    assert "Nothing to be done" in snakedvc(repo, "exp", "run", "--dry").stdout
    assert snakedvc(repo, "exp", "run", "--dry", "-f").stdout.split() == ["copy"]
    ran = len(list((repo / ".snakedvc/pipeline").glob("*/ran/*")))
    snakedvc(repo, "exp", "run", "-f", "-n", "forced")
    assert len(list((repo / ".snakedvc/pipeline").glob("*/ran/*"))) == ran + 1


# prepare's output does not depend on its param (a rounding); `count` appends to a file the stages
# do not declare, so each run of a stage leaves a line.
UNCHANGED_UPSTREAM = """\
stages:
  prepare:
    cmd: python -c "import yaml; n = yaml.safe_load(open('params.yaml'))['n']; print(round(n))" > prepared.txt && echo prepare >> runs.txt
    params: [n]
    outs: [prepared.txt]
  featurize:
    cmd: cp prepared.txt features.txt && echo featurize >> runs.txt
    deps: [prepared.txt]
    outs: [features.txt]
  train:
    cmd: cp features.txt model.txt && echo train >> runs.txt
    deps: [features.txt]
    outs: [model.txt]
"""


def test_a_stage_whose_inputs_came_out_unchanged_is_skipped_at_run_time(tmp_path: Path) -> None:
    """`dvc repro` decides each stage just before it would run: prepare reruns (its param changed)
    but writes the same bytes, so featurize and train are skipped ("didn't change, skipping").
    The kit's plan is fixed at the start: they wait for that decision, made on the submit host."""
    files = {"params.yaml": "n: 2.0\n", "dvc.yaml": UNCHANGED_UPSTREAM, ".gitignore": "runs.txt\n"}
    origin = dvc_project(tmp_path / "origin", files)
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")
    for repo in (by_dvc, by_kit):  # the baseline: every stage run and committed
        dvc(repo, "repro")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "reproduced")
        (repo / "runs.txt").unlink()
    dvc(by_dvc, "exp", "run", "-n", "rounded", "-S", "n=2.2")
    out = snakedvc(by_kit, "exp", "run", "-n", "rounded", "-S", "n=2.2")
    assert (by_dvc / "runs.txt").read_text() == "prepare\n"
    assert (by_kit / "runs.txt").read_text() == "prepare\n", out.stderr
    assert "Stage 'featurize' didn't change, skipping" in out.stdout  # the job's line, as DVC's console has it
    assert (by_kit / "dvc.lock").read_text() == (by_dvc / "dvc.lock").read_text()
    assert experiment(by_kit, "rounded") == experiment(by_dvc, "rounded")
    # A change that does reach them: both run, in both runners.
    dvc(by_dvc, "exp", "run", "-n", "three", "-S", "n=3")
    snakedvc(by_kit, "exp", "run", "-n", "three", "-S", "n=3")
    assert (
        (by_kit / "runs.txt").read_text() == (by_dvc / "runs.txt").read_text() == "prepare\nprepare\nfeaturize\ntrain\n"
    )
    assert (by_kit / "dvc.lock").read_text() == (by_dvc / "dvc.lock").read_text()


@pytest.mark.parametrize("stop", ["sigint-to-it", "sigterm-to-its-group"])
def test_a_stopped_local_run_stops_its_stages_and_records_only_the_finished(tmp_path: Path, stop: str) -> None:
    """SIGINT to `snakedvc exp run` alone, as a detached run's controller sends it on a cancel, or
    SIGTERM to its process group, as a forced cancel of a local run sends it: the running stage's
    command stops too (Snakemake's local executor would wait for it; Snakemake has a process group
    of its own), the finished stage stays committed, the stopped one is not recorded, no traceback."""
    stages = {"stages": {
        "first": {"cmd": "echo 1 > first.txt", "outs": ["first.txt"]},
        "second": {"cmd": "sleep 300 && echo 2 > second.txt", "deps": ["first.txt"], "outs": ["second.txt"]},
    }}  # fmt: skip
    repo = clone(dvc_project(tmp_path / "origin", {"dvc.yaml": yaml.safe_dump(stages)}), "stopped")
    # Started as `cmd &` from a script starts it: SIGINT ignored, which the kit must undo (it heard
    # no cancel, and ran on for 300 s, where CI was started in the background).
    run = subprocess.Popen(
        [str(BIN / "snakedvc"), "exp", "run"], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip

    def sleeping() -> list[str]:
        out = subprocess.run(["pgrep", "-f", "^sleep 300$"], capture_output=True, text=True).stdout
        return [pid for pid in out.split() if Path(f"/proc/{pid}/cwd").resolve() == repo.resolve()]

    try:
        wait_until(sleeping, "stage second's command running", 120, proc=run)
        if stop == "sigint-to-it":
            run.send_signal(signal.SIGINT)
        else:
            os.killpg(run.pid, signal.SIGTERM)
        # Seconds here; over 60 in CI under load. The kit itself waits up to STOP_WAIT_S (60 s) for
        # Snakemake before its SIGKILL: the test must outwait that, not race it.
        _, stderr = run.communicate(timeout=STOP_WAIT_S + 240)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, stderr
    assert "snakedvc exp: stopped (interrupted)" in stderr and "Traceback" not in stderr, stderr
    assert sleeping() == []
    assert set(lock(repo)["stages"]) == {"first"}


# A pipeline whose outputs live in a DVC remote: a fresh clone has none of them. Each run of a
# stage appends to runs.txt, which no stage declares.
REMOTE_DATA = """\
stages:
  prepare:
    cmd: echo ${n} > data.txt && echo prepare >> runs.txt
    params: [n]
    outs: [data.txt]
  train:
    cmd: cat data.txt > model.txt && echo ${lr} >> model.txt && echo train >> runs.txt
    deps: [data.txt]
    params: [lr]
    outs: [model.txt]
  other:
    cmd: echo other > other.txt && echo other >> runs.txt
    outs: [other.txt]
"""


def test_pull_and_allow_missing_do_what_dvc_exp_run_does_in_a_fresh_clone(tmp_path: Path) -> None:
    """`--pull`: a stage whose only change is missing data is pulled from the DVC remote, not run,
    and a stage that runs gets its missing dependencies pulled first; `--allow-missing`: missing
    data alone is no change. Each way, both runners run the same stages and record the same.
    With a `dvc add`ed input (raw.txt), the kit's one `dvc pull raw.txt.dvc data.txt ...` pulled
    raw.txt alone (DVC's pull takes only .dvc files after a first one), and every stage reran."""
    files = {"params.yaml": "n: 1\nlr: 0.1\n", "dvc.yaml": REMOTE_DATA, ".gitignore": "runs.txt\n"}
    origin = dvc_project(tmp_path / "origin", files)
    (origin / "raw.txt").write_text("raw\n")
    dvc(origin, "add", "raw.txt")
    dvc(origin, "stage", "add", "-n", "use_raw", "-d", "raw.txt", "-o", "used.txt",
        "cp raw.txt used.txt && echo use_raw >> runs.txt")  # fmt: skip
    dvc(origin, "remote", "add", "-d", "store", str(tmp_path / "remote"))
    dvc(origin, "repro")
    dvc(origin, "push")
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "reproduced, pushed")
    cases = {
        "nothing-changed": (["--pull"], ""),
        "lr-changed": (["--pull", "-S", "lr=0.5"], "train\n"),
        "lr-changed-allow-missing": (["--allow-missing", "-S", "lr=0.5"], "train\n"),
    }
    for case, (options, ran) in cases.items():
        by_dvc, by_kit = clone(origin, f"{case}-dvc"), clone(origin, f"{case}-kit")
        for repo in (by_dvc, by_kit):
            if "--allow-missing" in options:  # train's input here, the rest missing
                dvc(repo, "pull", "prepare")
        dvc(by_dvc, "exp", "run", *options, "-n", case)
        out = snakedvc(by_kit, "exp", "run", *options, "-n", case)
        for repo in (by_dvc, by_kit):
            runs = repo / "runs.txt"
            assert (runs.read_text() if runs.exists() else "") == ran, (case, repo.name, out.stderr)
        assert (by_kit / "dvc.lock").read_text() == (by_dvc / "dvc.lock").read_text(), case
        assert experiment(by_kit, case) == experiment(by_dvc, case)
        here = {name: (by_kit / name).exists() for name in ("data.txt", "model.txt", "other.txt", "used.txt")}
        assert here == {name: (by_dvc / name).exists() for name in here}, case
        assert (by_kit / "model.txt").read_text() == (by_dvc / "model.txt").read_text()
        if case == "nothing-changed":
            assert (by_kit / "model.txt").read_bytes() == (origin / "model.txt").read_bytes()
            assert all(here.values())  # pulled
        if case == "lr-changed-allow-missing":
            assert not here["other.txt"]  # missing, skipped, not run


def test_a_new_stage_downstream_runs_in_a_fresh_clone_with_pull_and_allow_missing(tmp_path: Path) -> None:
    """`--pull --allow-missing` in a fresh clone: a stage added after the push, never run, runs
    (its missing input pulled first); the stages upstream, missing data only, do not. DVC counts a
    missing input as changed where the stage before it recorded other data for it (DVC's own suite:
    test_repro_allow_missing_and_pull)."""
    files = {"params.yaml": "n: 1\nlr: 0.1\n", "dvc.yaml": REMOTE_DATA, ".gitignore": "runs.txt\n"}
    origin = dvc_project(tmp_path / "origin", files)
    dvc(origin, "remote", "add", "-d", "store", str(tmp_path / "remote"))
    dvc(origin, "repro")
    dvc(origin, "push")
    dvc(origin, "stage", "add", "-n", "report", "-d", "model.txt", "-o", "report.txt",
        "cat model.txt > report.txt && echo report >> runs.txt")  # fmt: skip
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "reproduced, pushed; a new stage")
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")
    dvc(by_dvc, "exp", "run", "--pull", "--allow-missing", "-n", "report")
    out = snakedvc(by_kit, "exp", "run", "--pull", "--allow-missing", "-n", "report")
    for repo in (by_dvc, by_kit):
        assert (repo / "runs.txt").read_text() == "report\n", (repo.name, out.stderr)
        assert (repo / "report.txt").read_bytes() == (origin / "model.txt").read_bytes()
    assert (by_kit / "dvc.lock").read_text() == (by_dvc / "dvc.lock").read_text()
    assert experiment(by_kit, "report") == experiment(by_dvc, "report")


def test_outputs_changed_by_hand_are_put_back_before_the_run_as_dvc_exp_run_does(tmp_path: Path) -> None:
    """`dvc exp run` checks the pipeline's outputs out of the cache before it reproduces: an output
    edited by hand is restored and a deleted one comes back, so nothing runs; the kit does the same."""
    files = {"params.yaml": "n: 1\nlr: 0.1\n", "dvc.yaml": REMOTE_DATA, ".gitignore": "runs.txt\n"}
    origin = dvc_project(tmp_path / "origin", files)
    dvc(origin, "repro")
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "reproduced")
    (origin / "runs.txt").unlink()
    for runner in ("dvc", "kit"):
        repo = tmp_path / runner
        shutil.copytree(origin, repo, symlinks=True)  # the cache too
        (repo / "model.txt").write_text("edited by hand\n")
        (repo / "data.txt").unlink()
        if runner == "dvc":
            dvc(repo, "exp", "run", "-n", "restored")
        else:
            snakedvc(repo, "exp", "run", "-n", "restored")
        assert not (repo / "runs.txt").exists(), runner  # nothing ran
        for name in ("model.txt", "data.txt"):
            assert (repo / name).read_bytes() == (origin / name).read_bytes(), (runner, name)
    assert (tmp_path / "kit" / "dvc.lock").read_text() == (tmp_path / "dvc" / "dvc.lock").read_text()


def test_a_dvc_repository_in_a_subfolder_of_git_records_its_lock_file(tmp_path: Path) -> None:
    """A DVC repository in a subfolder of the git repository (`dvc init --subdir`): the experiment
    commit holds its dvc.lock and no DVC scratch file, as `dvc exp run`'s does (DVC's own suite:
    test_subrepo; `dvc exp save` alone leaves an untracked dvc.lock out there)."""
    files = {}
    for runner in ("dvc", "kit"):
        top = tmp_path / runner
        repo = top / "dir" / "repo"
        repo.mkdir(parents=True)
        git(top, "init", "-q", "-b", "main")
        dvc(repo, "init", "-q", "--subdir")
        (repo / "params.yaml").write_text("foo: 1\n")
        dvc(repo, "stage", "add", "-n", "copy", "-p", "foo", "-M", "metrics.yaml", "cp params.yaml metrics.yaml")
        git(top, "add", "-A")
        git(top, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "a DVC repository in dir/repo")
        (dvc if runner == "dvc" else snakedvc)(repo, "exp", "run", "-S", "foo=2", "-n", "sub")
        files[runner] = git(top, "show", "--name-only", "--format=", experiment_rev(repo, "sub")).split()
    assert files["kit"] == files["dvc"] == ["dir/repo/dvc.lock", "dir/repo/metrics.yaml", "dir/repo/params.yaml"]


ODD_SHAPES = """\
stages:
  plain:
    cmd: echo ${n} > plain.txt
    params: [n, nested.k]
    outs: [plain.txt]
  spaced:
    cmd: |
      echo one > spaced.txt

      echo "two: ${n}, and a line long enough for the writer to fold it onto the next one" >> spaced.txt
    outs: [spaced.txt]
  listed:
    cmd:
    - echo first > listed.txt
    - echo second >> listed.txt
    outs: [listed.txt]
  each:
    foreach: [a, b, c]
    do:
      cmd: echo ${item} > each-${item}.txt
      outs: ["each-${item}.txt"]
"""


def test_dvc_lock_entries_are_reordered_by_moving_lines_to_the_bytes_a_parse_and_dump_gives(tmp_path: Path) -> None:
    """The bookkeeper puts dvc.lock's entries in DVC's order by moving lines, not with a parse and
    a dump of the whole file (seconds at a thousand stages): the bytes are those DVC's own
    round-trip writes, params, folded and listed commands and foreach entries among them; a
    file of another shape is left to the round-trip."""
    import random

    from dvc.utils.serialize import modify_yaml

    from snakedvc.engine.dvcpipeline.commit import reorder_lock_entries

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    dvc(repo, "init", "-q")
    (repo / "dvc.yaml").write_text(ODD_SHAPES)
    (repo / "params.yaml").write_text("n: 3\nnested: {k: 1, other: 2}\n")
    dvc(repo, "repro", "-q")
    written = (repo / "dvc.lock").read_text()
    assert "\n      " in written and "    - echo second" in written and "each@a" in written  # the shapes are there
    for seed in range(5):
        moved, dumped = tmp_path / f"moved{seed}.lock", tmp_path / f"dumped{seed}.lock"
        moved.write_text(written)
        dumped.write_text(written)

        def shuffled(keys: list[str], seed: int = seed) -> list[str]:
            keys = list(keys)
            random.Random(seed).shuffle(keys)
            return keys

        assert reorder_lock_entries(moved, shuffled)
        with modify_yaml(str(dumped)) as data:
            entries = data["stages"]
            order = shuffled(list(entries))
            items = [(key, entries[key]) for key in order]
            entries.clear()
            entries.update(items)
        assert moved.read_bytes() == dumped.read_bytes()
        assert list(yaml.safe_load(moved.read_text())["stages"]) == order
    other = tmp_path / "other.lock"
    other.write_text("stages:\n    plain:\n      cmd: x\n")  # entries indented by four
    assert not reorder_lock_entries(other, shuffled) and other.read_text() == "stages:\n    plain:\n      cmd: x\n"


def test_a_stage_job_waiting_for_word_gives_up_soon_after_its_run_stops_beating(tmp_path: Path) -> None:
    """A stage's job waits for the submit host's word whether to run: it waited 600 s where that
    host was gone (issue 51: a cancelled remote run's evaluate job hung 3 minutes). Its run moves a
    heartbeat; unmoved for stale_s, the job stops, saying so. While it moves, the job waits on."""
    import threading
    import time

    from snakedvc.engine.dvcpipeline.run import heartbeat
    from snakedvc.stage import HEARTBEAT, wait_for_decision

    word = tmp_path / "decided" / "rule_train"
    alive = word.with_name(HEARTBEAT)
    with heartbeat(alive, every_s=0.05):
        wait_until(alive.is_file, "the first beat", 30)
    said = wait_for_decision(word, wait_s=600, stale_s=1)  # it beat, then stopped: the run is gone
    assert said.startswith("stop ") and "stopped beating" in said, said

    # Beating, the job outwaits wait_s (the bound for a run without a heartbeat) until the word comes.
    def say_run_after(beats: int) -> None:
        seen = set()
        while len(seen) < beats:
            seen.add(alive.stat().st_mtime_ns)
            time.sleep(0.01)
        word.write_text("run\n")

    with heartbeat(alive, every_s=0.05):
        writer = threading.Thread(target=say_run_after, args=(30,))
        writer.start()
        assert wait_for_decision(word, wait_s=0.5, stale_s=60) == "run"
        writer.join()


LIVE_PIPELINE = """\
stages:
  gate:
    cmd: touch {gate}/waiting && while [ ! -e {gate}/go ]; do sleep 0.2; done && echo ${{lr}} > gate.txt
    params: [lr]
    outs: [gate.txt]
  train:
    cmd: >-
      mkdir -p live/plots/metrics && echo "step	loss" > live/plots/metrics/loss.tsv &&
      echo '{{"step": 7, "loss": 0.5}}' > live/metrics.json
    outs: [live]
"""


def test_a_submitted_runs_live_line_shows_no_training_that_dvc_checked_out_before_its_jobs(tmp_path: Path) -> None:
    """A run lists no live training that is not its own: the dvclive folder of a stage that does
    not run, which --pull fetched from the DVC remote at the run's start (after its record was
    made), is an earlier experiment's (issue 51: `runs` showed the previous run's last epoch)."""
    from snakedvc.engine.runs import Run
    from snakedvc.engine.runs.state import training_progress

    gate = tmp_path / "gate"
    gate.mkdir()
    repo = dvc_project(tmp_path / "origin", {"params.yaml": "lr: 0.1\n", "dvc.yaml": LIVE_PIPELINE.format(gate=gate)})
    (gate / "go").touch()
    dvc(repo, "remote", "add", "-d", "store", str(tmp_path / "store"))
    dvc(repo, "repro", "--quiet")  # an earlier run's dvclive folder, on the DVC remote
    dvc(repo, "push", "--quiet")
    (gate / "go").unlink()
    (gate / "waiting").unlink()
    # As in the cluster's fresh clone (`exp run --remote`): the run's --pull writes it anew.
    for made in ("live", "gate.txt", ".dvc/cache"):
        shutil.rmtree(repo / made) if (repo / made).is_dir() else (repo / made).unlink()
    run_id = snakedvc(repo, "submit", "--name", "lr2", "--pull", "-S", "lr=0.2").stdout.strip()
    run = Run.load(repo / ".snakedvc/runs" / run_id)
    try:
        wait_until((gate / "waiting").exists, "the run's one changed stage running", 300)
        assert (run.workspace / "live/metrics.json").is_file()  # DVC pulled the earlier one
        assert training_progress(run) == []
    finally:
        (gate / "go").touch()  # the run ends, whatever was found
    ended = wait_until(lambda: ended_run(repo, run_id), f"run {run_id} to end", 300, poll=1)
    assert ended["state"] == "done", snakedvc(repo, "logs", run_id).stdout


SUBFOLDER_STAGE = """\
stages:
  copy-file:
    cmd: cp params.yaml metrics.yaml
    params: [foo]
    metrics:
      - metrics.yaml:
          cache: false
"""


def test_exp_run_in_a_subfolder_reads_targets_and_params_there_as_dvc_does(tmp_path: Path) -> None:
    """From a subfolder, DVC reads a stage name, a dvc.yaml path and -S's params file there; the kit
    put its folders there and read them at the root (DVC's own test_subdir found it)."""
    origin = dvc_project(tmp_path / "origin", {"dir/dvc.yaml": SUBFOLDER_STAGE, "dir/params.yaml": "foo: 1\n"})
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")
    for value, target in (("2", []), ("3", ["dvc.yaml"]), ("4", ["copy-file"])):
        dvc(by_dvc / "dir", "exp", "run", *target, "-S", f"foo={value}", "-n", f"foo{value}")
        snakedvc(by_kit / "dir", "exp", "run", *target, "-S", f"foo={value}", "-n", f"foo{value}")
        assert (by_kit / "dir/metrics.yaml").read_text() == (by_dvc / "dir/metrics.yaml").read_text()
        assert experiment(by_kit, f"foo{value}") == experiment(by_dvc, f"foo{value}")
        assert experiment(by_kit, f"foo{value}")["params"]["dir/params.yaml"]["data"] == {"foo": int(value)}
    assert (by_kit / "dir/dvc.lock").read_text() == (by_dvc / "dir/dvc.lock").read_text()
    assert not (by_kit / "dir/.snakedvc").exists() and not (by_kit / "params.yaml").exists()
    assert git(by_kit, "status", "--porcelain") == git(by_dvc, "status", "--porcelain")
