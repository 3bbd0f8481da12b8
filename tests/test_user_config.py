"""A user's own config, checked with no schema written: `--config` against the project's config files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_snakemake

SNAKEFILE = """\
import snakedvc

configfile: "config.yaml"
include: snakedvc.module_path("kit")

rule train:
    output: "out/model.txt"
    threads: config["procs"]
    params: lr=config["train"]["lr"]
    shell: "echo {params.lr} > {output}"

rule all:
    default_target: True
    input: rules.train.output
"""
CONFIG = """\
procs: 1
name: first
train:
  lr: 0.01
  hidden: [32, 16]
snakedvc:
  tracking: false
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "config.yaml").write_text(CONFIG)
    return tmp_path


@pytest.mark.parametrize(
    ("override", "said"),
    [
        # A typo: argparse would have refused it in the job, after Snakemake removed the old outputs.
        ("train={lrr: 0.1}", "--config key 'train.lrr' is not in the config (config.yaml); keys allowed in 'train': hidden, lr"),
        ("epochs=3", "--config key 'epochs' is not in the config (config.yaml); keys allowed at the top: name, procs, snakedvc, train"),
        # A resource: Snakemake said `ResourceConstraintError: Resource("_cores", "two")`, naming no key.
        ("procs=two", "--config key 'procs': 'two' is not a number like the config's 1 (config.yaml)"),
        ("train={hidden: 8}", "--config key 'train.hidden': 8 is not a list like the config's [32, 16]"),
    ],
)  # fmt: skip
def test_a_config_value_the_config_file_does_not_have_is_refused_before_any_job(
    project: Path, override: str, said: str
) -> None:
    proc = run_snakemake(project, "--cores", "1", "--config", override, check=False)
    assert proc.returncode == 1
    # One line, no stack: Snakemake showed the kit's file and `File "…/kit.smk", line 22`, read as a crash.
    assert any(line.startswith(f"ConfigError: {said}") for line in proc.stderr.splitlines()), proc.stderr
    assert 'File "' not in proc.stderr and "kit.smk" not in proc.stderr, proc.stderr
    assert not (project / "out").exists()


@pytest.mark.parametrize("override", ["procs=2", "train={lr: 0.3}", "train={hidden: [8]}", "name=2", "name=second"])
def test_values_of_the_config_files_kinds_run(project: Path, override: str) -> None:
    run_snakemake(project, "--cores", "2", "--config", override)
    assert (project / "out/model.txt").is_file()


def test_a_configfile_may_bring_new_keys_and_the_users_schema_still_decides(project: Path) -> None:
    (project / "more.yaml").write_text("extra: 5\n")
    run_snakemake(project, "--cores", "1", "--configfile", "config.yaml", "more.yaml", "--config", "extra=6")
    # With a schema of the user's own, the schema decides (it allows a key no config file has).
    (project / "schema.yaml").write_text(
        "$schema: https://json-schema.org/draft/2020-12/schema\ntype: object\n"
        "properties:\n  procs: {type: integer}\n  epochs: {type: integer, default: 1}\n"
    )
    (project / "config.yaml").write_text(
        CONFIG.replace("  tracking: false", "  tracking: false\n  schema: schema.yaml")
    )
    run_snakemake(project, "-n", "--cores", "1", "--config", "epochs=3")
    proc = run_snakemake(project, "-n", "--cores", "1", "--config", "procs=two", check=False)
    assert proc.returncode != 0 and "config key 'procs'" in proc.stderr + proc.stdout


def test_check_overrides_allows_numbers_for_numbers_and_anything_for_null() -> None:
    from snakedvc.engine.config import ConfigError, check_overrides

    base = {"a": 1.5, "b": None, "c": {"d": True}}
    check_overrides(base, {"a": 2, "b": [1], "c": {"d": False}}, "config.yaml")
    with pytest.raises(ConfigError, match=r"'c.d': 'yes' is not true or false"):
        check_overrides(base, {"c": {"d": "yes"}}, "config.yaml")


def last_word(stderr: str) -> str:
    """The run's last line before Snakemake's own closing lines (its log's path, the elapsed time)."""
    lines = [line for line in stderr.strip().splitlines() if not line.startswith(("Complete log", "Elapsed time"))]
    return lines[-1]


def test_a_run_ends_with_one_line_naming_its_experiment_or_why_none(project: Path) -> None:
    from tests.conftest import dvc, dvc_experiments, git

    off = run_snakemake(project, "--cores", "1")
    assert last_word(off.stderr).startswith("snakedvc: run not recorded: tracking is off")
    git(project, "init", "-q", "-b", "main")
    dvc(project, "init", "-q")
    (project / "config.yaml").write_text(
        CONFIG.replace("tracking: false", "tracking: true\n  experiment: {metrics: []}")
    )
    (project / "dvc.yaml").write_text("params: [results/params.yaml]\n")
    git(project, "add", "-A")
    git(project, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "project")
    proc = run_snakemake(project, "--cores", "1", "--config", "train={lr: 0.5}")
    last = last_word(proc.stderr)
    name = last.removeprefix("snakedvc: saved experiment ").split(" ")[0]
    assert last == f"snakedvc: saved experiment {name} (see it: dvc exp show; snakedvc report)", last
    assert dvc_experiments(project)[name]["params"]["train"]["lr"] == 0.5
