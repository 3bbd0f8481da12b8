"""The workflow on a real single-host SLURM cluster (scripts/slurm-cluster), through profiles/slurm."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import yaml

from tests.conftest import (
    REPO,
    SMALL_RUN,
    copy_project,
    md5,
    run_snakemake,
    running_rule_jobs,
    slurm_jobs_by_rule,
    venv_env,
    without_slurm,
)
from tests.waiting import text_of, wait_until

pytestmark = pytest.mark.slurm

COMPARED = [
    "results/split/train.csv",
    "results/features/train.npz",
    "results/features/valid.npz",
    "results/features/test.npz",
    "results/model/model.pt",
    "results/model/live/metrics.json",
    "results/model/live/plots/metrics/valid_rmse.tsv",
    "results/metrics.json",
    "results/predictions.csv",
]


def sacct(jobid: str) -> dict[str, str]:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", jobid, "-o", "Partition,AllocCPUS,ReqMem,Timelimit,AllocTRES,State"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    partition, cpus, mem, limit, tres, state = out.splitlines()[0].split("|")
    return {"partition": partition, "cpus": cpus, "mem": mem, "timelimit": limit, "tres": tres, "state": state}


def ended_row(jobid: str) -> dict[str, str] | None:
    """The job's accounting row, once it shows the job's end."""
    try:
        row = sacct(jobid)
    except (subprocess.CalledProcessError, IndexError, ValueError):  # not in accounting yet
        return None
    return row if row["state"] not in {"PENDING", "RUNNING", "COMPLETING"} else None


def wait_for_sacct(jobid: str, timeout: float = 30) -> dict[str, str]:
    """The job's accounting row once accounting has heard of its end: Snakemake goes on when the
    batch script exits (its exit code file), which slurmdbd may learn a few seconds later."""
    return wait_until(
        lambda: ended_row(jobid),
        f"accounting of job {jobid}'s end",
        timeout,
        poll=0.5,
        explain=lambda: subprocess.run(["sacct", "-X", "-P", "-j", jobid], capture_output=True, text=True).stdout,
    )


def test_pipeline_on_slurm_matches_local_and_asks_rule_resources(slurm_cluster, tmp_path: Path) -> None:
    local = copy_project(tmp_path / "local")
    on_slurm = copy_project(tmp_path / "slurm")
    run_snakemake(local, "--profile", "profiles/local", *SMALL_RUN)
    proc = run_snakemake(on_slurm, "--profile", "profiles/slurm", *SMALL_RUN)
    jobs = slurm_jobs_by_rule(proc.stdout + proc.stderr)

    # The run's report reads what each job used from sacct: one row per SLURM job, named by its rule.
    # Written straight after the run, before accounting may have heard of the last job's end: the
    # report waits for it, so every job shows COMPLETED with its figures.
    subprocess.run([sys.executable, "-m", "snakedvc", "report", "--", *SMALL_RUN], cwd=on_slurm, check=True)
    page = (on_slurm / "results/report.html").read_text()
    assert "From sacct (SLURM jobs in Snakemake&#x27;s last log)." in page
    for rule, ids in jobs.items():
        for jobid in ids:
            row = re.search(rf"<tr><td>{jobid} {rule}[^<]*</td><td>COMPLETED</td>(.*?)</tr>", page)
            assert row, (rule, jobid, re.findall(rf"<tr><td>{jobid} .*?</tr>", page))
            elapsed, cpu, efficiency, rss, nodes, rss_in_job = re.findall(r"<td>([^<]*)</td>", row.group(1))
            assert float(elapsed) >= 0 and float(cpu) >= 0 and efficiency.endswith("%") and nodes == "1"
            # The job's own peak memory (Snakemake's sampling of the batch script's processes, from its
            # benchmark file) beside accounting's, which samples every 30 s here and may miss a short
            # job's peak. evaluate runs in the batch script (train runs as a job step: only accounting).
            if rule == "evaluate":
                assert rss_in_job.endswith(" MB") and float(rss_in_job.split()[0]) > 100, (rule, rss_in_job)
    assert "sampled every 30 s (JobAcctGatherFrequency)" in page

    for path in COMPARED:
        assert md5(local / path) == md5(on_slurm / path), f"{path} differs between local and SLURM"

    # A clean terminal: none of plugin 2.8's noise (its failing account guess, its advice to use
    # squeue whenever sacct is chosen); the account line it replaces is said once.
    out = proc.stdout + proc.stderr
    for noise in ("invalid option", "trying to guess", "Unable to guess", "should work reliably"):
        assert noise not in out, (noise, out[-3000:])
    assert out.count("SLURM account: ") <= 1

    assert {rule: len(ids) for rule, ids in jobs.items()} == {"split": 1, "featurise": 3, "train": 1, "evaluate": 1}
    params = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["resources"]
    expected = {
        "split": ("cpu", params["default"], 0),
        "featurise": ("cpu", params["featurise"], 0),
        "train": ("gpu", params["train"], 1),  # profiles/slurm gives train the gpu partition and 1 GPU
        "evaluate": ("cpu", params["default"], 0),
    }
    for rule, (partition, res, gpus) in expected.items():
        for jobid in jobs[rule]:
            row = wait_for_sacct(jobid)
            assert row["partition"] == partition, (rule, row)
            assert row["mem"] == f"{res['mem_mb']}M", (rule, row)
            minutes = res["runtime"]
            assert row["timelimit"] == f"{minutes // 60:02d}:{minutes % 60:02d}:00", (rule, row)
            assert f"cpu={res['threads']}" in row["tres"], (rule, row)
            if gpus:
                assert f"gres/gpu={gpus}" in row["tres"], (rule, row)
            else:
                assert "gres/gpu" not in row["tres"], (rule, row)
            assert row["state"] == "COMPLETED"


def test_report_waits_for_accounting_to_hear_of_a_finished_runs_last_jobs(slurm_cluster, tmp_path: Path) -> None:
    from snakedvc.engine.report import sacct_jobs

    # A job that is still running when the report asks: without waiting, its row says so (once
    # accounting lists it at all).
    jobid = subprocess.run(
        ["sbatch", "--parsable", "-D", str(tmp_path), "-o", "/dev/null", "--wrap", "sleep 6"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    listed = wait_until(lambda: sacct_jobs({jobid: "sleep"}), f"accounting to list job {jobid}", timeout=30)
    assert listed[0]["state"] in {"PENDING", "RUNNING"}, listed
    # A run that is over: asks again until accounting shows the job's end.
    start = time.monotonic()
    (settled,) = sacct_jobs({jobid: "sleep"}, settle_s=60)
    assert settled["state"] == "COMPLETED" and settled["elapsed_s"] >= 6, settled
    assert time.monotonic() - start < 30


def test_failed_rule_names_rule_and_log(slurm_cluster, project: Path) -> None:
    raw = project / "data/raw/esol.csv"
    lines = raw.read_text().splitlines()
    for i in range(1, 200, 20):
        lines[i] = lines[i].rsplit(",", 1)[0] + ",C1CC(bad"
    raw.write_text("\n".join(lines) + "\n")
    proc = run_snakemake(project, "--profile", "profiles/slurm", *SMALL_RUN, "--retries", "0", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Error in rule featurise" in out
    assert "logs/featurise/train.log" in out
    assert "max_reject_fraction" in (project / "logs/featurise/train.log").read_text()
    # The kept SLURM log of the failed job is named too.
    failed_jobs = slurm_jobs_by_rule(out)["featurise"]
    assert any(f"rule_featurise/train/{jobid}.log" in out for jobid in failed_jobs)
    assert not (project / "results/features/train.npz").exists()


def test_missing_partition_fails_fast_naming_it(slurm_cluster, project: Path, tmp_path: Path) -> None:
    # The documented override path: a site profile, the shipped profile untouched.
    site = tmp_path / "site"
    site.mkdir()
    (site / "config.yaml").write_text(yaml.safe_dump({"default-resources": {"slurm_partition": "nosuchpart"}}))
    started = time.monotonic()
    proc = run_snakemake(
        project, "--profile", "profiles/slurm", "--workflow-profile", str(site), *SMALL_RUN, check=False, timeout=120
    )
    assert proc.returncode != 0
    assert "nosuchpart" in proc.stdout + proc.stderr
    # Fails at the first sbatch (seconds), not after a wait for a job that can never start.
    assert time.monotonic() - started < 45
    assert not (project / "results/split").exists()


def test_scancelled_job_is_reported_and_retried(slurm_cluster, project: Path) -> None:
    # Long enough to be caught running: many epochs on the small subset.
    config = ["--config", "data={limit: 200}", "train={max_epochs: 400, patience: 400, hidden_sizes: [512, 256]}"]
    snakemake = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", *config],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = project / "logs/train.log"

    def training_job() -> str | None:
        """The running train job, once its log shows an epoch: the training's srun step is under way."""
        if not re.search(r"epoch \d+ train_loss", text_of(log)):
            return None
        return next(iter(running_rule_jobs("train", project)), None)

    try:
        what = "the train job running, its log showing an epoch"
        jobid = wait_until(training_job, what, 300, 0.5, explain=partial(text_of, log), proc=snakemake)
        subprocess.run(["scancel", jobid], check=True)
        output, _ = snakemake.communicate(timeout=600)
    finally:
        if snakemake.poll() is None:
            snakemake.kill()
    assert snakemake.returncode == 0, output[-3000:]
    assert "CANCELLED" in output
    jobs = slurm_jobs_by_rule(output)
    assert len(jobs["train"]) == 2 and jobs["train"][0] == jobid
    assert (project / "results/metrics.json").is_file()
    # The first attempt's rule log is kept beside the retry's: what stopped it is still there.
    assert "the last attempt's log is kept as logs/train.attempt1.log" in output
    first = (project / "logs/train.attempt1.log").read_text()
    retry = (project / "logs/train.log").read_text()
    # srun's own words for the scancel: "Job step aborted" when slurmctld tells it, "forcing job
    # termination" when its SIGTERM is handled; on a busy machine the second can be cut off by the kill.
    stopped = ("srun: Job step aborted", "srun: forcing job termination")
    assert "launch: srun" in first and any(line in first for line in stopped), first
    assert "launch: srun" in retry and not any(line in retry for line in stopped), retry


def test_dry_run_without_slurm_binaries(tmp_path: Path, project: Path) -> None:
    env = without_slurm(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--profile", "profiles/slurm"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The job-stats table of the plan: every step, with one featurise job per split.
    counts = dict(re.findall(r"^(split|featurise|train|evaluate|all)\s+(\d+)\s*$", proc.stdout, re.M))
    assert counts == {"split": "1", "featurise": "3", "train": "1", "evaluate": "1", "all": "1"}, proc.stdout


def test_make_dag_renders_every_rule(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["make", "-s", "dag", f"DAG_DIR={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("dag.svg", "rulegraph.svg"):
        svg = (tmp_path / name).read_text()
        for rule in ("split", "featurise", "train", "evaluate", "all"):
            assert f">{rule}<" in svg, (name, rule)


def numbered_steps(jobid: str) -> list[str]:
    """The job's srun steps (<jobid>.0, ...); the plugin's jobstep would make one per job it runs."""
    wait_for_sacct(jobid)
    ids = subprocess.run(
        ["sacct", "-n", "-P", "-j", jobid, "-o", "JobID"], capture_output=True, text=True, check=True
    ).stdout.split()
    return [i for i in ids if "." in i and i.rsplit(".", 1)[1].isdigit()]


def test_train_with_two_processes_through_slurm(slurm_cluster, project: Path) -> None:
    config = [
        "--config",
        "data={limit: 200}",
        "train={max_epochs: 3, hidden_sizes: [32]}",
        "resources={train: {processes: 2}}",
    ]
    proc = run_snakemake(project, "--profile", "profiles/slurm", *config)
    log = (project / "logs/train.log").read_text()
    assert "rank 0 of 2" in log and "rank 1 of 2" in log
    (jobid,) = slurm_jobs_by_rule(proc.stdout + proc.stderr)["train"]
    row = wait_for_sacct(jobid)
    assert row["partition"] == "gpu"
    assert "cpu=2" in row["tres"] and "gres/gpu=1" in row["tres"], row
    assert row["state"] == "COMPLETED"
    # The training is one job step, made by `snakedvc launch` (so --signal=TERM@90 reaches it).
    assert numbered_steps(jobid) == [f"{jobid}.0"]
    assert (project / "results/metrics.json").is_file()


def test_sharded_featurisation_on_slurm_matches_local_bytes(slurm_cluster, project: Path) -> None:
    """Sharded featurise jobs run as Snakemake job groups (the rule's group "shards", the profile's
    group-components): one sbatch call and one Snakemake start-up per group, not per shard."""

    targets = ["results/features/train.npz", "results/features/train.rejects.csv"]
    config = ["--config", "data={limit: 300}"]

    def md5s() -> list[str]:
        return [md5(project / t) for t in targets]

    split = run_snakemake(project, "--profile", "profiles/slurm", *config, "--", "results/split/train.csv")
    (split_job,) = slurm_jobs_by_rule(split.stdout + split.stderr)["split"]
    # A single job runs in its batch script's Snakemake too: no srun step, no second Snakemake.
    assert numbered_steps(split_job) == []
    run_snakemake(project, "--profile", "profiles/local", *config, "featurise={shards: 1}", "--", *targets)
    local = md5s()
    # The profile's groups, and groups of 3 shards.
    (profile_groups,) = [
        int(item.split("=")[1])
        for item in yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())["group-components"]
        if item.startswith("shards=")
    ]
    for shards, per_group, extra in ((8, profile_groups, []), (8, 3, ["--group-components", "shards=3"])):
        for target in targets:
            (project / target).unlink()
        proc = run_snakemake(
            project, "--profile", "profiles/slurm", *extra, *config, f"featurise={{shards: {shards}}}", "--", *targets
        )
        out = proc.stdout + proc.stderr
        submitted = re.findall(r"submitted with SLURM jobid (\d+) \(log: (\S+)\)", out)
        assert len(submitted) == -(-shards // per_group), out[-3000:]  # ceil: one job per group
        # Every submission a featurise group: gather_features runs on the submit host.
        assert all("/group_shards" in log for _, log in submitted), submitted
        # The group's jobs ran in the batch script's Snakemake (local executor): no srun step,
        # no second Snakemake per shard.
        for jobid, _ in submitted:
            assert numbered_steps(jobid) == [], jobid
        assert md5s() == local, f"{shards} shards in groups of {per_group} on SLURM differ from 1 shard locally"


SHELL_WORDS = """\
rule all:
    input: expand("out/{i}.txt", i=[1, 2])

rule part:
    output: "out/{i}.txt"
    resources: mem_mb=100, runtime=5
    shell: "pwd > {output}"
"""


@pytest.mark.parametrize("arrays", [[], ["--snakedvc-slurm-array-jobs", "all"]], ids=["jobs", "an-array"])
def test_a_project_folder_named_with_shell_words_runs_on_slurm_and_none_of_them_runs(
    slurm_cluster, tmp_path: Path, arrays: list[str]
) -> None:
    """The official plugin passes each job's command as sbatch --wrap="..." through a shell on the
    submit host: inside double quotes, a `$(...)` or backquotes in the project's folder name ran
    there, at every job's submission (issue 51: a file appeared; the job then failed). The kit's
    executor feeds the command to sbatch as a script on stdin, never through a shell; an array's
    jobs (which only --wrap submits) go one by one where their command holds such words."""
    repo = tmp_path / 'it\'s "q" $(touch pwned) `touch pwned2`; touch pwned3'
    repo.mkdir()
    (repo / "Snakefile").write_text(SHELL_WORDS)
    shutil.copytree(REPO / "profiles/slurm", repo / "profiles/slurm")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "--jobs", "2", *arrays],
        cwd=repo, capture_output=True, text=True, env=venv_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"submitted with SLURM jobid \d+", proc.stdout + proc.stderr), proc.stderr[-3000:]
    for i in (1, 2):  # each job ran in the project's folder
        assert (repo / f"out/{i}.txt").read_text().strip() == str(repo)
    made = [
        p.name for p in (*repo.iterdir(), *tmp_path.iterdir(), *Path.home().iterdir()) if p.name.startswith("pwned")
    ]
    assert made == [], made
