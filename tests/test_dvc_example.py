"""examples/dvc-pipeline: a plain DVC project (get-started layout) run as its user runs it.

The folder is copied into a repository of its own; `dvc exp run` runs it in one clone and
`snakedvc exp run` in another. Both leave the same bytes, dvc.lock and experiment; the kit's
experiment then goes where DVC's would (`dvc exp push` to a git remote and a directory remote)
and DVC's plots read it.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, git
from tests.test_dvc_pipeline import clone, dvc, experiment, lock, snakedvc

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "dvc-pipeline"
OUTPUTS = ["data/prepared/train.csv", "data/prepared/test.csv", "data/features/train.npz",
           "data/features/test.npz", "model.pt", "eval/metrics.json", "eval/predictions.csv"]  # fmt: skip


def md5s(repo: Path) -> dict[str, str]:
    return {path: hashlib.md5((repo / path).read_bytes()).hexdigest() for path in OUTPUTS}


def test_the_example_runs_as_dvc_runs_it_and_its_experiment_travels(tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    shutil.copytree(EXAMPLE, origin)
    git(origin, "init", "-q", "-b", "main")
    dvc(origin, "init", "-q")
    git(origin, "add", "-A")
    git(origin, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "the example")
    git(origin, "config", "receive.denyCurrentBranch", "ignore")  # the clones push experiments here
    by_dvc, by_kit = clone(origin, "by-dvc"), clone(origin, "by-kit")

    dvc(by_dvc, "exp", "run", "-S", "train.hidden=8", "-n", "small")
    out = snakedvc(by_kit, "exp", "run", "-S", "train.hidden=8", "-n", "small")
    # One job per stage, each foreach item its own: prepare, featurize@train, featurize@test, train, evaluate.
    ran = re.findall(r"^(?:\S+\| )?Running stage '([^']+)':$", out.stdout, re.M)  # DVC's line, as DVC's console
    assert sorted(ran) == sorted(["prepare", "featurize@train", "featurize@test", "train", "evaluate"]), out.stdout
    assert md5s(by_kit) == md5s(by_dvc)
    assert lock(by_kit) == lock(by_dvc) and experiment(by_kit, "small") == experiment(by_dvc, "small")
    assert 0.8 < experiment(by_kit, "small")["metrics"]["eval/metrics.json"]["data"]["accuracy"] <= 1
    assert "up to date" in dvc(by_kit, "status").stdout

    # The experiment travels as DVC's does: its commit to the git remote, its data to DVC's.
    store = tmp_path / "store"
    dvc(by_kit, "remote", "add", "--local", "-d", "store", str(store))
    dvc(by_kit, "exp", "push", "origin", "small")
    assert any(
        ref.endswith("/small") for ref in git(origin, "for-each-ref", "--format=%(refname)", "refs/exps").split()
    )
    model = lock(by_kit)["stages"]["train"]["outs"][0]["md5"]
    assert (store / "files/md5" / model[:2] / model[2:]).is_file()
    plots = dvc(by_kit, "plots", "diff", "small", "--show-vega", "--targets", "eval/predictions.csv")
    assert '"actual"' in plots.stdout and '"predicted"' in plots.stdout
