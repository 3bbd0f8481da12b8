"""`snakedvc exp run`: a project's own dvc.yaml, every stage a Snakemake job, recorded as `dvc exp run` records it.

Each test writes a DVC project of its own (no Snakefile), clones it twice, runs `dvc exp run` in
one clone and `snakedvc exp run` in the other with the same `-S`, and compares what DVC keeps:
the outputs' bytes, dvc.lock, the experiment's params and metrics in `dvc exp show --json`, and
`dvc status` after both.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from snakedvc.engine.dvcpipeline import PipelineError, kit_profile, read_plan
from tests.conftest import git, slurm_jobs_by_rule
from tests.test_tutorial import BIN, run

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
      cmd: python3 -c "print(open('${folder}/data.txt').read().strip(), '${item}')" > ${folder}/feat-${item}.txt
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


def dvc(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(cwd, str(BIN / "dvc"), *args, check=check)


def snakedvc(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(cwd, str(BIN / "snakedvc"), *args, check=check)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q", "-b", "main")
    (origin / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    (origin / "more.yaml").write_text(yaml.safe_dump(MORE_PARAMS))
    (origin / "dvc.yaml").write_text(DVC_YAML)
    dvc(origin, "init", "-q")
    (origin / ".gitignore").write_text(".snakemake/\n.snakedvc/\n")
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
    assert out.stdout.strip() == "same"
    assert outputs(by_kit) == outputs(by_dvc) and len(outputs(by_kit)) == 8
    assert lock(by_kit) == lock(by_dvc)  # dicts: the stages' order in the file is the order they finished
    assert experiment(by_kit, "same") == experiment(by_dvc, "same")
    assert experiment(by_kit, "same")["params"]["more.yaml"]["data"] == {"scale": 3}
    for repo in (by_dvc, by_kit):
        assert "up to date" in dvc(repo, "status").stdout
    # One job per stage and per foreach/matrix item: 1 + 3 + 2 + 1 + 1.
    plan_folder = next((by_kit / ".snakedvc/pipeline").iterdir())
    assert len(list((plan_folder / "ran").iterdir())) == 8

    # Nothing changed: no job. One param changed: the stages `dvc repro` runs (measured: `dvc repro
    # --dry` lists only 'train', the stage whose param changed; the real run goes on to 'evaluate',
    # whose input train then changes).
    assert "Nothing to be done" in snakedvc(by_kit, "exp", "run").stdout
    for repo in (by_dvc, by_kit):
        (repo / "params.yaml").write_text(yaml.safe_dump({**PARAMS, "train": {"lr": 0.3, "epochs": 4}}))
    assert list(read_plan(by_kit, "x").run) == ["train", "evaluate"]
    ran = re.findall(r"Running stage '([^']+)'", dvc(by_dvc, "repro").stdout)
    assert ran == ["train", "evaluate"]
    plans = len(list((by_kit / ".snakedvc/pipeline").iterdir()))
    taken = snakedvc(by_kit, "exp", "run", "-n", "same", check=False)
    assert taken.returncode == 1 and "experiment 'same' exists already" in taken.stderr
    assert len(list((by_kit / ".snakedvc/pipeline").iterdir())) == plans  # refused before any job
    snakedvc(by_kit, "exp", "run", "-n", "second")
    assert outputs(by_kit) == outputs(by_dvc) and lock(by_kit) == lock(by_dvc)


def test_a_failing_stage_names_itself_and_keeps_the_stages_before_it(project: Path) -> None:
    repo = clone(project, "failing")
    (repo / "params.yaml").write_text(yaml.safe_dump({**PARAMS, "train": {"lr": "oops", "epochs": 3}}))
    proc = snakedvc(repo, "exp", "run", check=False)
    assert proc.returncode == 1
    assert "Error in rule stage_train" in proc.stdout + proc.stderr
    log = re.search(r"stage 'train' failed: its log is (\S+) ", proc.stderr)
    assert log and "oops" in (repo / log.group(1)).read_text(), proc.stderr  # the command's own error
    assert "Committed to dvc.lock: prepare" in proc.stderr and "no experiment was saved" in proc.stderr
    committed = set(lock(repo)["stages"])
    assert {"prepare", "featurize@a", "combine@a-c"} <= committed and "train" not in committed
    assert not (repo / "out/model.txt").exists() or "train" not in committed


def test_a_persistent_output_is_refused_before_any_job(project: Path) -> None:
    repo = clone(project, "persist")
    text = (
        (repo / "dvc.yaml").read_text().replace("      - model.txt\n", "      - model.txt:\n          persist: true\n")
    )
    (repo / "dvc.yaml").write_text(text)
    with pytest.raises(PipelineError, match=r"stage 'train', output 'model.txt': persist"):
        read_plan(repo, "x")
    proc = snakedvc(repo, "exp", "run", check=False)
    assert proc.returncode == 1 and "persist" in proc.stderr and not (repo / "out").exists()


@pytest.mark.slurm
def test_exp_run_on_the_test_cluster_runs_a_job_per_stage(project: Path, slurm_cluster: None) -> None:
    by_dvc, by_kit = clone(project, "by-dvc"), clone(project, "by-kit")
    dvc(by_dvc, "exp", "run", "-n", "cluster")
    proc = snakedvc(by_kit, "exp", "run", "--profile", str(kit_profile("slurm")), "-n", "cluster")
    # One SLURM job per stage and per foreach/matrix item; the commits ran on the submit host.
    jobs = slurm_jobs_by_rule(proc.stdout + proc.stderr)
    assert sorted(jobs) == sorted(
        f"stage_{name}" for name in ("prepare", "featurize_a", "featurize_b", "featurize_c", "combine_a_c",
                                     "combine_b_c", "train", "evaluate")
    ) and all(len(ids) == 1 for ids in jobs.values()), jobs  # fmt: skip
    assert outputs(by_kit) == outputs(by_dvc)
    assert lock(by_kit) == lock(by_dvc)
    assert experiment(by_kit, "cluster") == experiment(by_dvc, "cluster")
    assert "up to date" in dvc(by_kit, "status").stdout
