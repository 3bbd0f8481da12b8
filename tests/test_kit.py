"""The kit's boundary and its Snakefile API: what a user's project relies on."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import snakedvc
from snakedvc.engine.tracking import (
    TrackingError,
    experiment_files,
    run_dvc,
    run_settings,
    save_experiment,
    track,
)
from tests.conftest import REPO, dvc, git

KIT = REPO / "src" / "snakedvc"
FORBIDDEN = ("esol", "molflux", "rdkit")


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_kit_imports_no_example_code_and_torch_only_in_its_extra() -> None:
    for path in KIT.rglob("*.py"):
        modules = imported_modules(path)
        assert not modules & set(FORBIDDEN), f"{path} imports {modules & set(FORBIDDEN)}"
        if "torch" in modules:
            assert path.parent.name == "torch", f"{path} imports torch outside snakedvc.torch"
    for path in KIT.rglob("*.smk"):
        text = path.read_text().lower()
        assert not any(name in text for name in FORBIDDEN), path


def kit_names_used(path: Path) -> set[str]:
    """Every kit name a file of an example uses: `from snakedvc[.torch] import X`, `snakedvc.X`."""
    import re

    text = path.read_text()
    if path.suffix == ".py":
        found = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("snakedvc"):
                found |= {f"{node.module}:{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {f"{a.name}:" for a in node.names if a.name.startswith("snakedvc") and a.name != "snakedvc"}
        return found | {f"snakedvc:{m}" for m in re.findall(r"\bsnakedvc\.(\w+)", text)}
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())  # comments name config keys
    return {f"snakedvc:{m}" for m in re.findall(r"\bsnakedvc\.(\w+)", code)}


def test_the_examples_use_the_kit_only_through_its_public_api() -> None:
    import snakedvc.live
    import snakedvc.torch

    public = {f"snakedvc:{n}" for n in snakedvc.__all__} | {f"snakedvc.torch:{n}" for n in snakedvc.torch.__all__}
    public |= {f"snakedvc.live:{n}" for n in snakedvc.live.__all__}
    public |= {"snakedvc:torch", "snakedvc:live"}  # the submodules themselves
    files = [*(REPO / "examples").rglob("*.py"), *(REPO / "workflow").rglob("*.smk"), REPO / "workflow" / "Snakefile"]
    files += [p for p in (REPO / "examples").rglob("Snakefile")]
    used: dict[str, set[str]] = {str(f.relative_to(REPO)): kit_names_used(f) - public for f in files}
    assert {f: names for f, names in used.items() if names} == {}
    assert any(kit_names_used(f) for f in files)  # the scan does find the kit
    # Members too: a workflow's sweep plan (SWEEP = snakedvc.sweep_plan(config)) only through its public ones.
    from snakedvc.engine.sweep.plan import PUBLIC

    members = {m for f in files for m in re.findall(r"\bSWEEP\.(\w+)", f.read_text())}
    assert members and members <= set(PUBLIC), members - set(PUBLIC)


def test_importing_the_kit_loads_neither_torch_nor_the_example() -> None:
    code = (
        "import sys, snakedvc, snakedvc.cli, snakedvc.launch, snakedvc.engine.sweep, snakedvc.engine.tracking\n"
        "import snakedvc.engine.workflow, snakedvc.engine.runs, snakedvc.live, snakedvc.lease, snakedvc.slurm\n"
        "print(sorted(m for m in ('torch', 'esol', 'molflux', 'rdkit', 'dvclive') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_job_side_loads_no_host_side_module() -> None:
    """What a step imports in a job (the kit's step-side names, snakedvc.torch, snakedvc.live, launch, lease)
    needs none of snakedvc.engine: the layout's split matches the two installs."""
    code = (
        "import sys, snakedvc, snakedvc.torch, snakedvc.live, snakedvc.launch, snakedvc.lease, snakedvc.slurm\n"
        "from snakedvc import atomic_path, log_to, progress\n"
        "from snakedvc.torch import Resumable, session, add_resume_arguments\n"
        "import snakedvc.torch.resume, snakedvc.torch.checkpoint\n"
        "print(sorted(m for m in sys.modules if m.startswith('snakedvc.engine')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    host = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, snakedvc; snakedvc.configure; print('snakedvc.engine.workflow' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert host.strip() == "True"  # the host side's names load it on first use


def test_shipped_modules_are_found() -> None:
    path = Path(snakedvc.module_path("tracking"))
    assert path.is_file() and "rule track:" in path.read_text()
    assert "checkpoint rung:" in Path(snakedvc.module_path("sweep")).read_text()
    with pytest.raises(ValueError, match="no module 'nope'"):
        snakedvc.module_path("nope")


def workflow_with(overrides: dict) -> SimpleNamespace:
    """What configure reads of Snakemake's workflow object: its --config values, as Snakemake parsed them."""
    return SimpleNamespace(config_settings=SimpleNamespace(overwrite_config=overrides))


def test_configure_gives_config_values_their_yaml_types(tmp_path: Path) -> None:
    # Snakemake reads nested --config values with YAML's BaseLoader: everything a string.
    config = {"train": {"max_epochs": 100, "lr": 0.001, "name": "base"}}
    overrides = {"train": {"max_epochs": "4", "lr": "1e-2", "amp": "true", "name": "run 1", "tag": "{a: 1}"}}
    snakedvc.configure(config, workflow_with(overrides))
    assert config["train"] == {"max_epochs": 4, "lr": 0.01, "amp": True, "name": "run 1", "tag": "{a: 1}"}
    assert config["snakedvc"]["tracking"] is True  # the kit's defaults filled in
    assert config["snakedvc"]["experiment"]["params"] == "results/params.yaml"


def test_configure_names_a_bad_kit_key_and_validates_the_users_schema(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(snakedvc.ConfigError, match=r"snakedvc: unknown config key 'experiment.metric'"):
        snakedvc.configure({"snakedvc": {"experiment": {"metric": "x"}}})
    schema = tmp_path / "schema.yaml"
    schema.write_text(
        "type: object\nproperties:\n  train:\n    type: object\n    properties:\n"
        "      epochs: {type: integer, minimum: 1, default: 3}\n"
    )
    monkeypatch.chdir(tmp_path)
    config = {"snakedvc": {"schema": "schema.yaml"}, "train": {}}
    snakedvc.configure(config)
    assert config["train"] == {"epochs": 3}
    with pytest.raises(snakedvc.ConfigError, match="train.epochs"):
        snakedvc.configure({"snakedvc": {"schema": "schema.yaml"}, "train": {"epochs": 0}})


def test_tracked_lists_dvc_targets_only_where_tracking_is_on(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    on = {"snakedvc": {"tracking": True}}
    assert snakedvc.tracked(on, ["a.csv", "b.csv"]) == []  # not a DVC repo
    (tmp_path / ".dvc").mkdir()
    assert snakedvc.tracked(on, ["a.csv", "b.csv"], "m/model.pt") == ["a.csv.dvc", "b.csv.dvc", "m/model.pt.dvc"]
    assert snakedvc.tracked({"snakedvc": {"tracking": False}}, ["a.csv"]) == []


@pytest.fixture
def dvc_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    dvc(repo, "init", "-q")
    git(repo, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-m", "init")
    return repo


def test_an_experiment_without_its_configured_metrics_is_an_error(dvc_repo: Path) -> None:
    config = {"snakedvc": {"experiment": {"metrics": ["out/metrics.json"], "files": ["out/curve.csv"]}}}
    own = ["out/metrics.json", "out/curve.csv", "out/model.pt"]
    with pytest.raises(TrackingError, match=r"did not produce out/metrics.json, out/curve.csv"):
        experiment_files(run_settings(config).experiment, own, dvc_repo)
    (dvc_repo / "out").mkdir()
    (dvc_repo / "out/metrics.json").write_text("{}")
    (dvc_repo / "out/curve.csv").write_text("x\n")
    (dvc_repo / "out/model.pt").write_bytes(b"weights")
    dvc(dvc_repo, "add", "out/model.pt")
    # Another run's tracked output, still in the workspace: not this run's record.
    (dvc_repo / "old").mkdir()
    (dvc_repo / "old/model.pt").write_bytes(b"an earlier run's weights")
    dvc(dvc_repo, "add", "old/model.pt")
    files = experiment_files(run_settings(config).experiment, own, dvc_repo)
    assert files == sorted(
        ["out/.gitignore", "out/model.pt.dvc", "out/metrics.json", "out/curve.csv", "results/params.yaml"]
    )
    assert not [f for f in files if f.startswith(".dvc/")]
    # A configured metrics file that lies in the workspace but no job of this run wrote.
    with pytest.raises(TrackingError, match=r"out/curve.csv .* is not an output of any job of this run"):
        experiment_files(run_settings(config).experiment, ["out/metrics.json", "out/model.pt"], dvc_repo)


def test_an_experiment_commit_holds_only_its_own_runs_results(dvc_repo: Path) -> None:
    """dvc exp save commits every untracked file dvc.yaml names as a metric; git keeps tracked ones.
    The kit's trim leaves out those its run did not write, and DVC's scratch files."""
    (dvc_repo / "dvc.yaml").write_text(
        "params: [results/params.yaml]\nmetrics: [results/metrics.json, results/trial.json]\n"
        "plots:\n  - results/live/plots/metrics:\n      x: step\n"
    )
    (dvc_repo / "results/live/plots/metrics").mkdir(parents=True)
    (dvc_repo / "results/metrics.json").write_text('{"accuracy": 0.5}')  # a committed, older result
    git(dvc_repo, "add", "-A")
    git(dvc_repo, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-m", "results of run A")
    (dvc_repo / "results/live/plots/metrics/loss.tsv").write_text("step\tloss\n1\t0.3\n")  # run A's, untracked
    (dvc_repo / "results/trial.json").write_text('{"accuracy": 0.9}')  # this run's
    config = {"snakedvc": {"experiment": {"metrics": ["results/trial.json"]}}}
    name = save_experiment(config, ["results/trial.json"], run_settings(config).experiment, name="trial", root=dvc_repo)
    ref = next(
        r for r in git(dvc_repo, "for-each-ref", "--format=%(refname)", "refs/exps").split() if r.endswith("/trial")
    )
    committed = git(dvc_repo, "ls-tree", "-r", "--name-only", ref).split()
    assert name == "trial"
    assert "results/trial.json" in committed and "results/params.yaml" in committed
    assert "results/metrics.json" not in committed and "results/live/plots/metrics/loss.tsv" not in committed
    assert not [path for path in committed if path.startswith(".dvc/tmp")]
    assert git(dvc_repo, "rev-parse", f"{ref}^") == git(dvc_repo, "rev-parse", "HEAD")  # baseline kept
    shown = json.loads(dvc(dvc_repo, "exp", "show", "--json").stdout)
    (exp,) = shown[1]["experiments"]
    metrics = exp["revs"][0]["data"]["metrics"]
    assert metrics["results/trial.json"]["data"] == {"accuracy": 0.9}
    assert "data" not in metrics["results/metrics.json"]


def test_a_failing_dvc_command_shows_dvcs_own_message(dvc_repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    with pytest.raises(TrackingError) as error:
        run_dvc(["add", str(outside)], dvc_repo)
    said = str(error.value).split("\n", 1)[1]
    assert "outside" in said.lower() and said.strip()


def test_preflight_names_outputs_dvc_would_refuse_and_the_fix(dvc_repo: Path, monkeypatch) -> None:
    monkeypatch.chdir(dvc_repo)
    on = {"snakedvc": {"tracking": True}}
    assert snakedvc.tracked(on, ["results/data/x.npz", "results/model.pt"]) == [
        "results/data/x.npz.dvc",
        "results/model.pt.dvc",
    ]
    # A .gitignore line meant for the top folder data/ also matches results/data/.
    (dvc_repo / ".gitignore").write_text("# raw inputs\ndata/\n")
    with pytest.raises(snakedvc.ConfigError) as error:
        snakedvc.tracked(on, ["results/data/x.npz", "results/model.pt"])
    said = str(error.value)
    assert "results/data/x.npz.dvc: git ignores it (.gitignore:2: 'data/')" in said
    assert "'/data/'" in said and "results/model.pt" not in said
    (dvc_repo / ".gitignore").write_text("/data/\n")
    # An output committed to git (`git add -A` after a run).
    (dvc_repo / "results").mkdir()
    (dvc_repo / "results/model.pt").write_bytes(b"weights")
    git(dvc_repo, "add", "results/model.pt")
    with pytest.raises(
        snakedvc.ConfigError, match=r"results/model.pt: git tracks it.*git rm --cached results/model.pt"
    ):
        snakedvc.tracked(on, ["results/data/x.npz", "results/model.pt"])


@pytest.mark.parametrize("line", ["results/", "/results/", "results"])
def test_every_fix_the_preflight_suggests_works_when_applied(dvc_repo: Path, monkeypatch, line: str) -> None:
    """A line that ignores the results folder itself: no '!' line after it can bring a .dvc file back
    (the old suggestions, '/results/' or '!results/model.pt.dvc', left the same error). The fix the
    message gives is applied as written, and `dvc add` then works."""
    monkeypatch.chdir(dvc_repo)
    on = {"snakedvc": {"tracking": True}}
    outputs = ["results/model.pt", "results/features/x.npz"]
    (dvc_repo / ".gitignore").write_text(f"*.pyc\n{line}\n")
    with pytest.raises(snakedvc.ConfigError) as error:
        snakedvc.tracked(on, outputs)
    said = str(error.value)
    replacement = re.search(r"replace that line with the three lines '([^']+)', '([^']+)' and '([^']+)'", said)
    assert replacement, said
    assert "'!results/model.pt.dvc'" not in said and "'/results/' for the top folder" not in said
    (dvc_repo / ".gitignore").write_text("*.pyc\n" + "\n".join(replacement.groups()) + "\n")
    assert snakedvc.tracked(on, outputs) == ["results/model.pt.dvc", "results/features/x.npz.dvc"]
    for path in outputs:
        (dvc_repo / path).parent.mkdir(parents=True, exist_ok=True)
        (dvc_repo / path).write_bytes(b"bytes")
    track(outputs, dvc_repo)
    assert (dvc_repo / "results/model.pt.dvc").is_file()
    assert git(dvc_repo, "status", "--porcelain", "--untracked-files=all").count(".dvc") == 2
    assert "results/model.pt\n" not in git(dvc_repo, "status", "--porcelain", "--untracked-files=all")


def test_init_leaves_dvc_files_visible_whatever_the_gitignore_held(tmp_path: Path) -> None:
    from snakedvc.engine.init import init
    from snakedvc.engine.workflow import preflight

    repo = tmp_path / "own"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / ".gitignore").write_text("__pycache__/\nresults/\n")
    init(repo)
    text = (repo / ".gitignore").read_text()
    assert "__pycache__/" in text.splitlines() and "results/" not in text.splitlines()
    preflight(["results/model.pt", "results/features/x.npz"], repo)  # no ConfigError
    assert git(repo, "check-ignore", "-n", "-v", "results/a/b.npz").startswith(".gitignore:")


def test_flags_give_an_ordinary_argparse_script_its_hyperparameters() -> None:
    import argparse
    import shlex

    section = {"lr": 0.01, "hidden_sizes": [64, 32], "weight_decay": 0, "name": "two words", "shuffle": False}
    text = snakedvc.flags(section)
    assert text == "--hidden-sizes 64 32 --lr 0.01 --name 'two words' --shuffle false --weight-decay 0"
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float)
    parser.add_argument("--hidden-sizes", type=int, nargs="+")
    parser.add_argument("--weight-decay", type=float)
    parser.add_argument("--name")
    parser.add_argument("--shuffle", type=lambda word: word == "true")
    args = parser.parse_args(shlex.split(text))
    assert vars(args) == {
        "lr": 0.01,
        "hidden_sizes": [64, 32],
        "weight_decay": 0.0,
        "name": "two words",
        "shuffle": False,
    }


def test_a_failed_push_keeps_dvcs_reason_names_the_remote_and_says_the_experiment_is_saved(
    dvc_repo: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    dvc(dvc_repo, "remote", "add", "-d", "store", str(blocker / "remote"))
    (dvc_repo / "out").mkdir()
    (dvc_repo / "out/model.pt").write_bytes(b"weights")
    dvc(dvc_repo, "add", "out/model.pt")
    config = {"snakedvc": {"experiment": {"push": True}}}
    with pytest.raises(TrackingError) as error:
        save_experiment(config, ["out/model.pt"], run_settings(config).experiment, name="pushed", root=dvc_repo)
    said = str(error.value)
    assert "experiment pushed is saved" in said and f"store {blocker / 'remote'}" in said, said
    assert "Not a directory" in said and "Having any troubles" not in said, said
    assert "dvc push && dvc exp push origin pushed" in said
    assert "pushed" in dvc(dvc_repo, "exp", "list", "--name-only").stdout


def test_training_stopped_left_uncaught_exits_75_and_except_exception_does_not_swallow_it() -> None:
    code = (
        "from snakedvc.torch import TrainingStopped\n"
        "try:\n    raise TrainingStopped(None, 3, 7, 'SIGTERM')\nexcept Exception:\n    print('swallowed')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 75 and "swallowed" not in proc.stdout, proc


def test_the_public_api_is_what_the_docs_list_capability_by_capability() -> None:
    """``snakedvc.API``: every name and member resolves, the docs' table (docs/reference.md, Public API) lists
    the same ones, its count is right."""
    import importlib
    import typing

    names: list[str] = []
    for capability, entries in snakedvc.API.items():
        for dotted, members in entries.items():
            module, _, attr = dotted.rpartition(".")
            target = getattr(importlib.import_module(f"snakedvc.{module}" if module else "snakedvc"), attr)
            if members and not isinstance(target, type):  # a function: its members are its result's
                target = typing.get_type_hints(target)["return"]
            for member in members:
                declared = hasattr(target, member) or member in typing.get_type_hints(target)
                assert declared, f"{capability}: {dotted} has no {member}"
            names += [attr, *members]
    readme = (REPO / "docs" / "reference.md").read_text()
    table = readme[readme.index("| capability | names you use |") :].split("\n\n", 1)[0]
    listed = [
        name
        for row in table.splitlines()[2:]
        for name in re.findall(r"`([\w.]+)`", row.split("|")[2])
        if not name.startswith("snakedvc")
    ]
    assert sorted(listed) == sorted(names)
    assert f"That is {len(names)} names for everything" in readme


FLAKY_SNAKEFILE = """
rule flaky:
    output: "done.txt"
    log: "logs/flaky.log"
    resources: try_number=lambda wildcards, attempt: attempt
    shell: "echo 'attempt {resources.try_number} says why' > {log}; test {resources.try_number} -ge 2 && touch {output}"
"""


def test_a_local_retry_keeps_the_last_attempts_log_as_slurm_does(tmp_path: Path) -> None:
    # The kit's local profile, in a project of its own (no DVC: nothing to record).
    (tmp_path / "Snakefile").write_text(FLAKY_SNAKEFILE)
    local = REPO / "profiles" / "local"
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", str(local), "--retries", "1", "--cores", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "logs/flaky.attempt1.log").read_text() == "attempt 1 says why\n"
    assert (tmp_path / "logs/flaky.log").read_text() == "attempt 2 says why\n"
    assert "attempt 2: the last attempt's log is kept as logs/flaky.attempt1.log" in proc.stderr


def kit_import_graph() -> dict[str, set[str]]:
    """Module -> the kit's modules it imports, anywhere in it (a function's import counts too)."""
    src = REPO / "src"
    modules = {}
    for path in src.rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules if name.startswith("snakedvc")}
    for name in graph:
        for node in ast.walk(ast.parse(modules[name].read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("snakedvc"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    graph[name].add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names if alias.name.startswith("snakedvc")}
    return graph


def test_the_kit_has_no_import_circle() -> None:
    # A circle is two rooms that each need the other: one of them holds what belongs to a third.
    import networkx as nx

    graph = nx.DiGraph([(a, b) for a, targets in kit_import_graph().items() for b in targets if a != b])
    circles = [c for c in nx.simple_cycles(graph) if "snakedvc" not in c]  # the package's __init__ re-exports
    assert circles == [], circles
