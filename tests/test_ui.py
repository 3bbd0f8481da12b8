"""`snakedvc ui` (issue 53), served over real projects and opened in a real headless Chromium
(tests/browser.py): a training's curve growing on the open page, a finished ASHA sweep of the
digits example with its stops' reasons, two experiments compared, the token, and `--remote`
through a real sshd. UPDATE_SCREENSHOTS=1 writes the docs' pictures (docs/images/ui/)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.browser import CHROMIUM, DOC_IMAGES, Tab, chromium_tab
from tests.conftest import REPO, git, without_slurm
from tests.sshd import laptop_env, start_sshd
from tests.test_dvc_pipeline import clone, dvc_project, ended_run, snakedvc
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM, reason="chromium is not installed")]

BIN = Path(sys.executable).parent

# A training that logs as dvclive does: one epoch per gate file (when a gate folder is given),
# its curve in live/plots/metrics/loss.tsv, its latest values in live/metrics.json.
TRAIN = """\
import json, os, sys, time, yaml
params = yaml.safe_load(open("params.yaml"))
gate = sys.argv[1] if len(sys.argv) > 1 else ""
os.makedirs("live/plots/metrics", exist_ok=True)
with open("live/plots/metrics/loss.tsv", "w") as tsv:
    tsv.write("step\\tloss\\n")
    for step in range(3):
        while gate and not os.path.exists(os.path.join(gate, f"epoch{step}")):
            time.sleep(0.1)
        loss = round(params["lr"] / (step + 1), 6)
        tsv.write(f"{step}\\t{loss}\\n")
        tsv.flush()
        json.dump({"step": step, "loss": loss}, open("live/metrics.json.tmp", "w"))
        os.replace("live/metrics.json.tmp", "live/metrics.json")
"""


def pipeline(gate: Path | None) -> str:
    command = "python3 train.py" + (f" {gate}" if gate else "")
    stage = {"cmd": command, "deps": ["train.py"], "params": ["lr", "seed"],
             "metrics": [{"live/metrics.json": {"cache": False}}], "plots": [{"live/plots/metrics": {"cache": False}}]}  # fmt: skip
    return yaml.safe_dump({"stages": {"train": stage}})


def project(tmp_path: Path, gate: Path | None = None) -> Path:
    files = {"train.py": TRAIN, "params.yaml": "lr: 0.1\nseed: 0\n", "dvc.yaml": pipeline(gate)}
    return clone(dvc_project(tmp_path / "origin", files), "project")


@contextlib.contextmanager
def ui(root: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`snakedvc ui ARGS` serving ``root``: the address it printed (with its token)."""
    proc = subprocess.Popen([str(BIN / "snakedvc"), "ui", *args], cwd=root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("snakedvc ui: http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        yield line.split(": ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


def shoot(tab: Tab, name: str) -> None:
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        tab.screenshot(DOC_IMAGES / "ui" / f"{name}.png")


def test_without_the_token_the_page_its_api_and_its_files_are_refused(tmp_path: Path) -> None:
    repo = project(tmp_path)
    with ui(repo) as address:
        base, token = address.split("/?token=")
        for path in ("/", "/api/runs", "/static/app.js", "/static/plotly.min.js"):
            assert status(base + path) == 403, path
            assert status(f"{base}{path}?token=wrong{token}") == 403, path
            assert status(f"{base}{path}?token={token}") == 200, path


def test_a_trainings_curve_grows_on_the_open_page_without_a_reload(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    repo = project(tmp_path, gate)
    run_id = snakedvc(repo, "submit", "--name", "growing").stdout.strip()
    try:
        with ui(repo) as address, chromium_tab() as tab:
            tab.goto(address)
            tab.wait_for(f"document.body.innerText.includes('{run_id}')", "the run in the runs list")
            tab.goto(address.replace("/?", "/?") + f"#/run/{run_id}")
            points = "(document.querySelector('[data-curve=\"live: loss\"]') || {dataset: {}}).dataset.points"
            (gate / "epoch0").touch()
            tab.wait_for(f"{points} === '1'", "the first epoch's point")
            tab.evaluate("window.sameDocument = true")
            (gate / "epoch1").touch()
            tab.wait_for(f"{points} === '2'", "the second epoch's point, without a reload")
            assert tab.evaluate("window.sameDocument") is True and tab.errors == []
            shoot(tab, "run")
            (gate / "epoch2").touch()
            tab.wait_for(f"{points} === '3'", "the third epoch's point")
            ended = wait_until(lambda: ended_run(repo, run_id), f"run {run_id} to end", 300, poll=1)
            assert ended["state"] == "done", snakedvc(repo, "logs", run_id).stdout
            # Once saved, the page shows the experiment's params and metrics (as DVC records them)
            # and the dvc.yaml's stages, each that ran ticked.
            record = "[...document.querySelectorAll('#record td')].map(td => td.innerText)"
            cells = tab.wait_for(f"{record}.includes('live/metrics.json:loss') && {record}", "the run's record")
            assert "params.yaml:lr" in cells and "0.1" in cells, cells
            drawn = tab.wait_for(
                "document.getElementById('dag').dataset.drawn === '1' && document.getElementById('dag').innerHTML",
                "the DAG",
            )
            assert "train ✓" in drawn and tab.errors == []
    finally:
        for step in range(3):
            (gate / f"epoch{step}").touch()


SNAKEFILE = """\
rule all:
    input: "b.txt"

rule make_a:
    output: "a.txt"
    shell: "echo a > {output}"

rule make_b:
    input: "a.txt"
    output: "b.txt"
    shell: "cat {input} > {output}"
"""


def test_a_snakefile_runs_page_draws_its_job_dag(tmp_path: Path) -> None:
    repo = tmp_path / "flow"
    repo.mkdir()
    (repo / "Snakefile").write_text(SNAKEFILE)
    git(repo, "init", "-q", "-b", "main")
    snakedvc(repo, "init")  # the profiles a submitted run needs
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "a workflow")
    run_id = snakedvc(repo, "submit", "--", "--config", "greeting=hi").stdout.strip()
    ended = wait_until(lambda: ended_run(repo, run_id), f"run {run_id} to end", 300, poll=1)
    assert ended["state"] == "done", snakedvc(repo, "logs", run_id).stdout
    with ui(repo) as address, chromium_tab() as tab:
        tab.goto(address + f"#/run/{run_id}")
        drawn = tab.wait_for(
            "document.getElementById('dag').dataset.drawn === '1' && document.getElementById('dag').innerHTML",
            "the job DAG",
        )
        assert "make_a" in drawn and "make_b" in drawn and "<svg" in drawn, drawn[:2000]
        given = tab.wait_for("document.getElementById('record').innerText", "what the run was given")
        assert "--config greeting=hi" in given and tab.errors == [], given


def test_two_experiments_compared_mark_the_params_that_differ_and_overlay_their_curves(tmp_path: Path) -> None:
    repo = project(tmp_path)
    for lr, name in (("0.2", "slow"), ("0.4", "fast")):
        snakedvc(repo, "exp", "run", "-S", f"lr={lr}", "-n", name)
    with ui(repo) as address, chromium_tab() as tab:
        tab.goto(address + "#/experiments")
        tab.wait_for("document.querySelectorAll('#exps input').length >= 3", "the experiments and their baseline")
        tab.evaluate(
            "document.querySelectorAll('#exps input').forEach(i => i.checked = ['slow', 'fast'].includes(i.dataset.name))"
        )
        tab.evaluate("document.getElementById('compare').click()")
        differs = "Object.fromEntries([...document.querySelectorAll('[data-key]')].map(e => [e.dataset.key, e.dataset.differs]))"
        marked = tab.wait_for(f"document.querySelector('[data-key]') && {differs}", "the compared keys")
        assert marked["params.yaml:lr"] == "1" and marked["params.yaml:seed"] == "0", marked
        assert marked["live/metrics.json:loss"] == "1" and marked["live/metrics.json:step"] == "0", marked
        traces = tab.wait_for(
            "(document.querySelector('[data-curve=\"loss\"]') || {dataset: {}}).dataset.traces", "the curves"
        )
        assert traces == "2" and tab.errors == []
        shoot(tab, "compare")


def digits_sweep(dest: Path) -> Path:
    """The digits example as a user's project, with a 4-trial ASHA sweep (rungs of 1 and 2 epochs)."""
    shutil.copytree(REPO / "examples/digits", dest, ignore=shutil.ignore_patterns("results", "logs", ".snakemake"))
    config = yaml.safe_load((dest / "config.yaml").read_text())
    config["resources"]["fit"]["gpu"] = 0
    (dest / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    sweep = {"enabled": True, "name": "four", "method": "grid", "strategy": "asha", "min_epochs": 1,
             "reduction_factor": 2, "max_concurrent_trials": 2, "space": {"train.lr": [0.001, 0.03], "train.hidden": [8, 64]}}  # fmt: skip
    (dest / "sweep.yaml").write_text(yaml.safe_dump({"snakedvc": {"sweep": sweep}, "train": {"epochs": 2}}))
    return dest


def test_an_asha_sweep_watched_to_its_end_shows_its_trials_and_why_each_stopped(tmp_path: Path) -> None:
    root = digits_sweep(tmp_path / "digits")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "the digits example")
    with ui(root) as address, chromium_tab() as tab:
        tab.goto(address + "#/sweep/four")
        sweep = subprocess.Popen(
            [str(BIN / "snakemake"), "--profile", str(REPO / "profiles/local"), "--configfile", "sweep.yaml", "--jobs", "2"],
            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        # Held (its whole process group stopped) as soon as it has written its plan: its trials are
        # on the page with their params while no report of the sweep exists yet.
        wait_until((root / "results/sweeps/four/plan.json").is_file, "the sweep's plan", 300, proc=sweep)
        os.killpg(sweep.pid, signal.SIGSTOP)
        try:
            running = tab.wait_for(
                "document.body.innerText.includes('4 trials, running') && document.body.innerText", "the running sweep"
            )
            assert "train.lr=0.03" in running and "train.hidden=64" in running, running
            assert not (root / "results/sweeps/four/report").exists()
        finally:
            os.killpg(sweep.pid, signal.SIGCONT)
        _, stderr = sweep.communicate(timeout=600)
        assert sweep.returncode == 0, stderr[-3000:]
        text = tab.wait_for(
            "document.body.innerText.includes('4 trials, ended') && document.body.innerText", "the ended sweep"
        )
        assert "winner" in text and "ASHA promotes the best 1 in 2" in text, text
        assert tab.wait_for("document.getElementById('parallel').dataset.lines", "parallel coordinates") == "4"
        assert "decisions: each one is what the rule gives" in text and tab.errors == []
        shoot(tab, "sweep")


@pytest.fixture
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    server, proc = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    proc.terminate()
    proc.wait(timeout=10)


def test_ui_remote_shows_the_clusters_runs_through_ssh(tmp_path: Path, sshd) -> None:  # noqa: ANN001
    laptop = laptop_env(sshd.laptop_home(tmp_path / "home"), f"{BIN}:{without_slurm(tmp_path)['PATH']}")
    repo = project(tmp_path)
    clones = tmp_path / "cluster"
    kit = str(BIN / "snakedvc")
    for command in (["remote", "add", "hpc", f"ssh://cluster{clones}", "--snakedvc", kit, "--profile", "local"],
                    ["submit", "--remote", "hpc", "--name", "far"]):  # fmt: skip
        proc = subprocess.run([kit, *command], cwd=repo, env=laptop, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    with ui(repo, "--remote", "hpc", env=laptop) as address, chromium_tab() as tab:
        tab.goto(address)
        text = tab.wait_for("document.body.innerText.includes('far') && document.body.innerText", "the remote run")
        assert "project on hpc" in tab.evaluate("document.title")
        run = json.loads(subprocess.run([kit, "runs", "--remote", "hpc", "--json"], cwd=repo, env=laptop,
                                        capture_output=True, text=True, check=True).stdout)[0]  # fmt: skip
        assert run["id"] in text and tab.errors == []


def test_ui_without_plotly_names_the_extra_to_install(tmp_path: Path) -> None:
    code = "import sys; sys.modules['plotly'] = None; from snakedvc.cli import main; sys.exit(main(['ui']))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=project(tmp_path), capture_output=True, text=True)
    assert proc.returncode != 0 and "pip install 'snakedvc[ui]'" in proc.stderr, proc.stderr


@pytest.mark.slurm
def test_a_slurm_runs_page_lists_its_jobs_and_opens_a_jobs_log(tmp_path: Path, slurm_cluster: None) -> None:
    repo = project(tmp_path)
    (repo / "snakedvc.yaml").write_text('resources:\n  "*": {runtime: 10, mem: 100MB}\n')  # a SLURM job of its own
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "resources")
    # lr a string: the training fails, and its SLURM job's log is kept (a successful job's is deleted)
    run_id = snakedvc(repo, "submit", "--profile", "slurm", "--name", "on-slurm", "-S", "lr=oops").stdout.strip()
    ended = wait_until(lambda: ended_run(repo, run_id), f"run {run_id} to end", 300, poll=1)
    assert ended["state"] == "failed", snakedvc(repo, "logs", run_id).stdout
    with ui(repo) as address, chromium_tab() as tab:
        tab.goto(address + f"#/run/{run_id}")
        jobs = "[...document.querySelectorAll('#jobs td')].map(td => td.innerText)"
        cells = tab.wait_for(f"{jobs}.includes('FAILED') && {jobs}", "the run's SLURM job, accounted")
        assert ended["slurm_jobs"][0] in cells and "stage_train" in cells, cells
        tab.evaluate("document.querySelector('#jobs a').click()")
        shown = tab.wait_for(
            "!document.getElementById('joblog').hidden && document.getElementById('joblog').innerText", "the job's log"
        )
        assert "python3 train.py" in shown and "Error in rule stage_train" in shown and tab.errors == [], shown
