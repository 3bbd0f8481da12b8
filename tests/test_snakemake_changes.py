"""Snakemake 9.15 -> 9.27.1: each upstream change that touches this project, guarded by a test.

Each test runs a tiny Snakefile of its own in a tmp dir with this interpreter's Snakemake (or
reads what we ship), so it fails when the behaviour it documents changes, whatever the ESOL
workflow does. The `slurm` ones run on the real test cluster (scripts/slurm-cluster).
What changed, what was measured against 9.15.0, and what we do: docs/snakemake-upgrade.md.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import snakemake
import yaml
from packaging.version import Version

from tests.conftest import REPO, SNAKEMAKE, accounted_jobs, without_slurm
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(
    Version(snakemake.__version__) < Version("9.27.1"),
    reason=f"guards the behaviour of Snakemake >= 9.27.1 (this is {snakemake.__version__})",
)

# Resources Snakemake reads as sizes (MB) or durations (minutes): the ones 9.16.3 made strict.
SIZE_OR_TIME = re.compile(r"^(mem|disk)(_[a-z]+)?$|^runtime$")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def smk(
    workdir: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SNAKEMAKE, *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def said(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


def planned(proc: subprocess.CompletedProcess[str]) -> set[str]:
    """Rules in the job-stats table of a dry run."""
    return set(re.findall(r"^([A-Za-z_]\w*)\s+\d+\s*$", said(proc), re.M)) - {"total"}


def shipped_profile(name: str) -> Path:
    return REPO / "profiles" / name


def shipped_profile_settings(name: str) -> dict[str, Any]:
    settings: dict[str, Any] = yaml.safe_load((shipped_profile(name) / "config.yaml").read_text())
    return settings


def size_and_time_resources(resources: Any, where: str) -> Iterator[tuple[str, Any]]:
    """(where.key, value) for every size or time resource in a (nested) resources mapping."""
    if not isinstance(resources, dict):
        return
    for key, value in resources.items():
        if isinstance(value, dict):
            yield from size_and_time_resources(value, f"{where}.{key}")
        elif SIZE_OR_TIME.match(str(key)):
            yield f"{where}.{key}", value


# --- 1. mem_mb may no longer be a string (9.16.3, "standardize handling of resources") --------


def test_shipped_size_and_time_resources_are_integers() -> None:
    """9.16.3: a string mem_mb (e.g. "4000") stops the run; 9.15 took it (a rule even got the text "4G").

    Nothing we ship may pass one: the example configs' `resources:` and every profile's
    default-resources / set-resources / resources."""
    found: dict[str, Any] = {}
    for config in (REPO / "config" / "config.yaml", REPO / "examples" / "digits" / "config.yaml"):
        data = yaml.safe_load(config.read_text())
        found.update(size_and_time_resources(data.get("resources"), str(config.relative_to(REPO))))
    for profile in sorted((REPO / "profiles").glob("*/config.yaml")):
        data = yaml.safe_load(profile.read_text())
        for key in ("default-resources", "set-resources", "resources"):
            found.update(size_and_time_resources(data.get(key), f"{profile.relative_to(REPO)}:{key}"))
    assert any(key.endswith(".mem_mb") for key in found), found  # the scan does see our resources
    strings = {key: value for key, value in found.items() if type(value) is not int}
    assert not strings, f"size/time resources must be integers (MB, minutes): {strings}"


def test_config_schemas_require_integer_memory_and_runtime() -> None:
    """9.16.3: the schemas are what keeps a user's string mem_mb out of a rule (see the kit test below)."""

    def typed(node: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(node, dict):
            for key, value in node.get("properties", {}).items():
                if key in ("mem_mb", "runtime"):
                    yield key, value.get("type")
            for value in node.values():
                yield from typed(value)
        elif isinstance(node, list):
            for value in node:
                yield from typed(value)

    for schema in (REPO / "workflow" / "schemas" / "config.schema.yaml", REPO / "examples" / "digits" / "schema.yaml"):
        types = list(typed(yaml.safe_load(schema.read_text())))
        assert types and all(kind == "integer" for _, kind in types), (schema, types)


RESOURCE_FROM_CONFIG = """
rule a:
    output: "a.txt"
    resources: mem_mb=config["mem_mb"]
    shell: "echo {resources.mem_mb} > {output}"
"""


@pytest.mark.parametrize("value", ['"4G"', '"4000"', "4000"])
def test_string_mem_mb_in_a_rule_is_an_error(tmp_path: Path, value: str) -> None:
    """9.16.3: a rule's mem_mb from a user's config must be an int: "4G" and even "4000" stop the run.

    (9.15 ran both; the SLURM plugin then got `--mem 4G`.)"""
    write(tmp_path / "Snakefile", RESOURCE_FROM_CONFIG)
    write(tmp_path / "config.yaml", f"mem_mb: {value}\n")
    proc = smk(tmp_path, "-c1", "--configfile", "config.yaml")
    if value == "4000":
        assert proc.returncode == 0, said(proc)
        assert (tmp_path / "a.txt").read_text().strip() == "4000"
    else:
        assert proc.returncode != 0
        assert "Resource 'mem_mb' must be assigned an int" in said(proc), said(proc)
        assert not (tmp_path / "a.txt").exists()


def test_string_mem_mb_in_a_profile_is_an_error_mem_with_units_is_not(tmp_path: Path) -> None:
    """9.16.3 + 9.17.3: in a profile, `mem_mb: "4000"` now stays a string and fails the job;
    `mem: "4G"` is how to give units (it becomes mem_mb=4000)."""
    write(tmp_path / "Snakefile", 'rule a:\n    output: "a.txt"\n    shell: "echo {resources.mem_mb} > {output}"\n')
    write(tmp_path / "bad" / "config.yaml", 'default-resources:\n  mem_mb: "4000"\n')
    write(tmp_path / "good" / "config.yaml", 'default-resources:\n  mem: "4G"\n')
    bad = smk(tmp_path, "-c1", "--profile", "bad")
    assert bad.returncode != 0
    assert "Resource 'mem_mb' assigned callable that returned '4000'" in said(bad), said(bad)
    good = smk(tmp_path, "-c1", "--profile", "good")
    assert good.returncode == 0, said(good)
    assert (tmp_path / "a.txt").read_text().strip() == "4000"


@pytest.mark.parametrize(("value", "ok"), [('"4G"', False), ('"4000"', True)])
def test_kit_config_names_a_string_mem_mb_before_any_job(tmp_path: Path, value: str, ok: bool) -> None:
    """9.16.3: with snakedvc.configure (as the examples use it), "4000" becomes 4000 and runs; "4G"
    stops at parse time with the kit's ConfigError naming the key, not Snakemake's resource error."""
    write(
        tmp_path / "schema.yaml",
        """
        $schema: "https://json-schema.org/draft/2020-12/schema"
        type: object
        additionalProperties: false
        properties:
          snakedvc: {type: object}
          resources:
            type: object
            properties:
              a:
                type: object
                properties:
                  mem_mb: {type: integer, minimum: 1, default: 1000, description: Memory in MB.}
        """,
    )
    write(
        tmp_path / "Snakefile",
        """
        import snakedvc

        snakedvc.configure(config, workflow)

        rule a:
            output: "a.txt"
            resources: mem_mb=config["resources"]["a"]["mem_mb"]
            shell: "echo {resources.mem_mb} > {output}"
        """,
    )
    write(
        tmp_path / "config.yaml",
        f"snakedvc: {{schema: schema.yaml, tracking: false}}\nresources: {{a: {{mem_mb: {value}}}}}\n",
    )
    proc = smk(tmp_path, "-c1", "--configfile", "config.yaml")
    if ok:
        assert proc.returncode == 0, said(proc)
        assert (tmp_path / "a.txt").read_text().strip() == "4000"
    else:
        assert proc.returncode != 0
        assert "ConfigError" in said(proc)
        assert "config key 'resources.a.mem_mb': '4G' is not of type 'integer'" in said(proc), said(proc)
        assert "Building DAG" not in said(proc)


# --- 2. Only the top-level Snakefile's onsuccess/onerror run (9.17.0, #4050) ----------------


HOOKS = re.compile(r"^\s*(onstart|onsuccess|onerror)\s*:", re.M)


def test_kit_modules_define_no_hooks_and_examples_finish_from_their_top_level() -> None:
    """9.17.0: hooks in a module never run, so the kit's modules must not define any. kit.smk is
    no module but an `include:` (its hooks are the including Snakefile's own, and run: the
    tutorial's test sees the experiment saved); ESOL, with modules of its own, calls
    snakedvc.finish_run from its top-level onsuccess, and digits includes kit.smk."""
    modules = sorted((REPO / "src" / "snakedvc" / "modules").glob("*.smk"))
    assert {m.name for m in modules} >= {"kit.smk", "tracking.smk", "sweep.smk"}
    # dvc_pipeline.smk is no module either: it is the Snakefile of exp run's Snakemake (--snakefile).
    for module in modules:
        if module.name not in ("kit.smk", "dvc_pipeline.smk"):
            assert not HOOKS.search(module.read_text()), f"{module} defines a hook that Snakemake >= 9.17 never runs"
    kit = (REPO / "src" / "snakedvc" / "modules" / "kit.smk").read_text()
    assert re.search(r"^onsuccess:\n    snakedvc.finish_run\(config, workflow\)$", kit, re.M)
    esol = [REPO / "workflow" / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    assert re.search(r"^onsuccess\s*:", esol[0].read_text(), re.M), f"{esol[0]}: no top-level onsuccess"
    assert any("snakedvc.finish_run(" in path.read_text() for path in esol), esol
    digits = (REPO / "examples" / "digits" / "Snakefile").read_text()
    assert re.search(r'^include: snakedvc.module_path\("kit"\)$', digits, re.M)
    assert not re.search(r"^onsuccess\s*:", digits, re.M)  # it would replace the kit's


MODULE_WITH_HOOKS = """
rule m:
    output: "m.txt"
    shell: "{command}"

onsuccess:
    open("module_onsuccess.txt", "w").write("ran\\n")

onerror:
    open("module_onerror.txt", "w").write("ran\\n")
"""

TOP_LEVEL = """
module mod:
    snakefile: "mod.smk"

use rule * from mod as mod_*

rule all:
    input: "m.txt"
    default_target: True
"""


@pytest.mark.parametrize("fails", [False, True])
def test_a_modules_hooks_do_not_run(tmp_path: Path, fails: bool) -> None:
    """9.17.0: a module's onsuccess/onerror are not run (9.15 ran them when the top level had none)."""
    write(tmp_path / "mod.smk", MODULE_WITH_HOOKS.format(command="exit 1" if fails else "echo m > {output}"))
    write(tmp_path / "Snakefile", TOP_LEVEL)
    proc = smk(tmp_path, "-c1")
    assert (proc.returncode != 0) == fails, said(proc)
    assert not (tmp_path / "module_onsuccess.txt").exists()
    assert not (tmp_path / "module_onerror.txt").exists()


def test_a_module_hook_runs_when_the_top_level_calls_it(tmp_path: Path) -> None:
    """9.17.0: the top level can still run a module's hook explicitly (`mod.onsuccess()`),
    which shows the hook above is sound and only Snakemake skips it."""
    write(tmp_path / "mod.smk", MODULE_WITH_HOOKS.format(command="echo m > {output}"))
    write(tmp_path / "Snakefile", TOP_LEVEL + "\nonsuccess:\n    mod.onsuccess()\n")
    proc = smk(tmp_path, "-c1")
    assert proc.returncode == 0, said(proc)
    assert (tmp_path / "module_onsuccess.txt").is_file()


def test_top_level_onsuccess_runs_under_touch_not_in_a_dry_run(tmp_path: Path) -> None:
    """9.27.0 (dry-run/touch became pseudo-executors): onsuccess still runs for `--touch`, as in 9.15.
    `snakedvc restore` touches, so it must keep telling finish_run not to save an experiment."""
    write(
        tmp_path / "Snakefile",
        """
        rule b:
            input: "a.txt"
            output: "b.txt"
            shell: "cat {input} > {output}"

        rule a:
            output: "a.txt"
            shell: "head -c 2000000 /dev/zero > {output}"

        onsuccess:
            with open("hooks.log", "a") as log:
                log.write("onsuccess\\n")
        """,
    )
    assert smk(tmp_path, "-c1").returncode == 0
    hooks = tmp_path / "hooks.log"
    assert hooks.read_text() == "onsuccess\n"
    # b out of date (a is too large for the checksum that would spare b): there is something to touch.
    an_hour_before_a = os.stat(tmp_path / "a.txt").st_mtime - 3600  # (an mtime of 0 reads as unknown)
    os.utime(tmp_path / "b.txt", (an_hour_before_a, an_hour_before_a))
    assert "b" in planned(smk(tmp_path, "-n"))
    assert hooks.read_text() == "onsuccess\n"  # the dry run ran no hook
    touch = smk(tmp_path, "-c1", "--touch")
    assert touch.returncode == 0, said(touch)
    assert hooks.read_text() == "onsuccess\nonsuccess\n"


# --- 3 and 6. What sbatch receives from profiles/slurm (9.17.3 quoting, 9.20.0 runtimes) ----

SBATCH_SHIM = """#!{python}
import json, os, sys
with open(os.environ["SBATCH_ARGV_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
os.execv({sbatch!r}, ["sbatch", *sys.argv[1:]])
"""

RUNTIME_RULES = """
rule all:
    input: "int_runtime.txt", "unit_runtime.txt", "string_runtime.txt"

rule int_runtime:
    output: "int_runtime.txt"
    resources: runtime=30, mem_mb=500
    shell: "scontrol show job $SLURM_JOB_ID > {output}"

rule unit_runtime:
    output: "unit_runtime.txt"
    resources: runtime="2h", mem_mb=500
    shell: "scontrol show job $SLURM_JOB_ID > {output}"

rule string_runtime:
    output: "string_runtime.txt"
    resources: runtime="45", mem="1G"
    shell: "scontrol show job $SLURM_JOB_ID > {output}"
"""


def copy_slurm_profile(dest: Path) -> Path:
    return Path(shutil.copytree(shipped_profile("slurm"), dest))


@pytest.fixture(scope="module")
def sbatch_calls(slurm_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[str], str]]:
    """rule -> (the argv sbatch got, `scontrol show job` from inside the job), for RUNTIME_RULES
    run through a copy of profiles/slurm. A shim first on PATH records sbatch's argv."""
    work = tmp_path_factory.mktemp("sbatch")
    copy_slurm_profile(work / "profile")
    write(work / "Snakefile", RUNTIME_RULES)
    shim = write(work / "shim" / "sbatch", SBATCH_SHIM.format(python=sys.executable, sbatch=shutil.which("sbatch")))
    shim.chmod(0o755)
    argv_log = work / "sbatch-argv.jsonl"
    env = {**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}", "SBATCH_ARGV_LOG": str(argv_log)}
    proc = smk(work, "--profile", "profile", env=env, timeout=600)
    assert proc.returncode == 0, said(proc)[-4000:]
    calls: dict[str, tuple[list[str], str]] = {}
    for line in argv_log.read_text().splitlines():
        argv = json.loads(line)
        rule = argv[argv.index("--comment") + 1].removeprefix("rule_")
        calls[rule] = (argv, (work / f"{rule}.txt").read_text())
    assert set(calls) == {"int_runtime", "unit_runtime", "string_runtime"}, calls.keys()
    return calls


@pytest.mark.slurm
def test_profile_slurm_extra_reaches_sbatch_as_plain_arguments(sbatch_calls: dict[str, tuple[list[str], str]]) -> None:
    """9.17.3 (quoted profile values stay strings): only numeric strings changed; the profile's
    `slurm_extra: "'--signal=TERM@90'"` still reaches sbatch as the bare argument --signal=TERM@90."""
    extra = shipped_profile_settings("slurm")["default-resources"]["slurm_extra"]
    # The plugin appends slurm_extra to a shell command line (shell=True): shlex gives what sbatch sees.
    expected = shlex.split(extra)
    assert any(arg.startswith("--signal=") for arg in expected), expected
    for rule, (argv, _) in sbatch_calls.items():
        for arg in expected:
            assert arg in argv, (rule, arg, argv)
        assert not [arg for arg in argv if arg[:1] in "'\""], (rule, argv)


@pytest.mark.slurm
def test_runtimes_reach_sbatch_and_slurm_in_minutes(sbatch_calls: dict[str, tuple[list[str], str]]) -> None:
    """9.20.0 (runtimes read as minutes): runtime=30 -> `-t 30`, "2h" -> `-t 120`, the string "45" -> `-t 45`
    (9.15 read a rule's "45" as seconds: 1 minute); and mem="1G" -> `--mem 1000`."""
    expected = {
        "int_runtime": ("30", "00:30:00", "500"),
        "unit_runtime": ("120", "02:00:00", "500"),
        "string_runtime": ("45", "00:45:00", "1000"),
    }
    for rule, (minutes, limit, mem) in expected.items():
        argv, job = sbatch_calls[rule]
        assert argv[argv.index("-t") + 1] == minutes, (rule, argv)
        assert argv[argv.index("--mem") + 1] == mem, (rule, argv)
        assert re.search(rf"\bTimeLimit={limit}\b", job), (rule, job)
        assert re.search(rf"\bMinMemoryNode={mem}M\b", job), (rule, job)


WAIT_FOR_TERM = """
import signal, sys, time

start = time.monotonic()


def on_term(signum, frame):
    with open(sys.argv[1], "w") as out:
        out.write(f"{time.monotonic() - start:.1f}\\n")
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
time.sleep(150)
"""


@pytest.mark.slurm
def test_profile_warning_signal_arrives_before_the_time_limit(slurm_cluster: None, tmp_path: Path) -> None:
    """9.17.3: the profile's quoted slurm_extra still sets SLURM's warning signal: a 2-minute job
    gets SIGTERM well before its limit (asked 90 s before; without --signal it comes at 120 s).
    SLURM signals job steps: the command runs through `snakedvc launch`, which makes one (a command
    run straight from the batch script hears nothing before the limit: measured 134 s)."""
    copy_slurm_profile(tmp_path / "profile")
    write(tmp_path / "wait.py", WAIT_FOR_TERM)
    evidence = tmp_path / "sigterm-after-seconds.txt"  # not an output: Snakemake deletes a failed job's outputs
    write(
        tmp_path / "Snakefile",
        f"""
        rule wait:
            output: "done.txt"
            resources: runtime=2, mem_mb=200
            shell: "exec {sys.executable} -m snakedvc launch -- {sys.executable} wait.py {evidence}"
        """,
    )
    # The TERM ends the job step, so the job fails; no retry.
    smk(tmp_path, "--profile", "profile", "--retries", "0", timeout=400)
    assert evidence.is_file(), "the job never got SIGTERM"
    # Before the limit, from the warning: the job failed on it, not TIMEOUT. Not a number of seconds:
    # SLURM sends it up to a minute late (119.4 s measured on a busy machine, with the signal asked at 30 s).
    seconds = float(evidence.read_text())
    assert seconds < 120, seconds
    states = wait_until(
        lambda: [job["state"] for job in accounted_jobs(tmp_path) if job["end"] not in ("", "Unknown")],
        "accounting to hear of the job's end", 120, poll=2,
    )  # fmt: skip
    # The job ends on the signal (FAILED), or, on a busy machine, when a late warning left the step's
    # end past the limit (CI: TIMEOUT). The signal's time above is what shows it came from the warning.
    assert states in (["FAILED"], ["TIMEOUT"]), (states, seconds)


def test_runtime_strings_and_units_are_minutes(tmp_path: Path) -> None:
    """9.20.0 (#4053): runtimes from rules, set-resources and default-resources are minutes, numeric
    strings included ("45" was 1 minute in a 9.15 rule, "30" in a profile 1 minute in 9.16.3-9.19)."""
    rules = {
        "r_int": "runtime=30, ",
        "r_unit": 'runtime="2h", ',
        "r_str": 'runtime="45", ',
        "r_set": "",
        "r_default": "",
    }
    text = "rule all:\n    input: " + ", ".join(f'"{name}.txt"' for name in rules) + "\n"
    for name, runtime in rules.items():
        text += (
            f'\nrule {name}:\n    output: "{name}.txt"\n    resources: {runtime}mem_mb=100\n'
            '    shell: "echo {resources.runtime} > {output}"\n'
        )
    write(tmp_path / "Snakefile", text)
    write(
        tmp_path / "profile" / "config.yaml",
        'default-resources:\n  runtime: "30"\nset-resources:\n  r_set:\n    runtime: "90m"\n',
    )
    proc = smk(tmp_path, "-c1", "--profile", "profile")
    assert proc.returncode == 0, said(proc)
    got = {name: int((tmp_path / f"{name}.txt").read_text()) for name in rules}
    assert got == {"r_int": 30, "r_unit": 120, "r_str": 45, "r_set": 90, "r_default": 30}


# --- 4. Reruns after restoring files (checksums; 9.18.0 is about storage plugins) ------------

CHAIN = """
rule all:
    input: "c.txt", "big_out.txt"

rule a:
    output: "a.txt"
    params: value=config.get("value", 1)
    shell: "echo {params.value} > {output}"

rule b:
    input: "a.txt"
    output: "b.txt"
    shell: "cat {input} {input} > {output}"

rule c:
    input: "b.txt"
    output: "c.txt"
    shell: "cat {input} > {output}"

rule big:
    output: "big.bin"
    shell: "head -c 2000000 /dev/zero > {output}"

rule big_out:
    input: "big.bin"
    output: "big_out.txt"
    shell: "wc -c < {input} > {output}"
"""


def restamp_newest_first(workdir: Path, *names: str) -> None:
    """Give files new mtimes, the first newest: like `dvc checkout`, which keeps no mtimes or order.
    (All in the past: an output touched to now must not be older than its input.)"""
    newest = time.time() - 10
    for age, name in enumerate(names):
        os.utime(workdir / name, (newest - age, newest - age))


def test_restored_files_are_rerun_only_above_the_checksum_size_limit(tmp_path: Path) -> None:
    """9.15 and 9.27.1 alike: an input newer than its output but with the checksum recorded at the
    last run does not trigger a rerun; a file over --max-checksum-file-size (1 MB) has no checksum,
    so its mtime does. DVC restores models and features (often > 1 MB): `--touch` is still needed."""
    write(tmp_path / "Snakefile", CHAIN)
    assert smk(tmp_path, "-c1").returncode == 0
    restamp_newest_first(tmp_path, "a.txt", "b.txt", "c.txt", "big.bin", "big_out.txt")
    plan = smk(tmp_path, "-n")
    assert plan.returncode == 0, said(plan)
    assert planned(plan) == {"big_out", "all"}, said(plan)
    assert "updated input files" in said(plan)
    assert smk(tmp_path, "-c1", "--touch").returncode == 0
    assert "Nothing to be done" in said(smk(tmp_path, "-n"))


def test_restored_outputs_of_an_earlier_run_need_touch(tmp_path: Path) -> None:
    """9.15 and 9.27.1 alike: restoring an earlier experiment's files (identical content, other params
    than the last run) still plans a rerun, because Snakemake's metadata holds the last run's params;
    `--touch` with the experiment's config re-records them (what `snakedvc restore` does)."""
    write(tmp_path / "Snakefile", CHAIN)
    assert smk(tmp_path, "-c1", "--config", "value=1").returncode == 0
    saved = {name: (tmp_path / name).read_bytes() for name in ("a.txt", "b.txt", "c.txt")}
    assert smk(tmp_path, "-c1", "--config", "value=2").returncode == 0
    for name, content in saved.items():  # `dvc exp apply` of the first run
        (tmp_path / name).write_bytes(content)
    restamp_newest_first(tmp_path, "a.txt", "b.txt", "c.txt")
    plan = smk(tmp_path, "-n", "--config", "value=1")
    assert {"a", "b", "c"} <= planned(plan), said(plan)
    assert "params have changed since last execution" in said(plan)
    assert smk(tmp_path, "-c1", "--touch", "--config", "value=1").returncode == 0
    assert "Nothing to be done" in said(smk(tmp_path, "-n", "--config", "value=1"))
    assert (tmp_path / "a.txt").read_text() == "1\n"


# --- 5. profile.yaml and --workflow-profile resolution (9.19.0, #4087) -----------------------

MARKER = 'print("MARKER", config.get("marker"))\n\nrule a:\n    output: "a.txt"\n    shell: "echo a > {output}"\n'


@pytest.mark.parametrize("name", ["local", "slurm"])
def test_shipped_profiles_load(tmp_path: Path, name: str) -> None:
    """9.19.0: `config.yaml` still names a profile; ours load (dry run, no SLURM on PATH) and add nothing
    else: no workflow profile is picked up."""
    write(tmp_path / "Snakefile", MARKER)
    profile = shipped_profile(name)
    proc = smk(tmp_path, "-n", "--profile", str(profile), env=without_slurm(tmp_path))
    assert proc.returncode == 0, said(proc)
    assert f"Using profile {profile} for setting default command line arguments." in proc.stderr
    assert "workflow specific profile" not in said(proc)
    if name == "slurm":
        assert "slurm_extra=" in said(proc)  # its default-resources reached the job


def test_profile_yaml_and_a_profile_file_path_are_accepted(tmp_path: Path) -> None:
    """9.19.0: a profile folder may hold `profile.yaml` (new default name), and --profile may name the
    YAML file itself. 9.15 knew only <folder>/config.yaml."""
    write(tmp_path / "Snakefile", MARKER)
    write(tmp_path / "new" / "profile.yaml", "config:\n  marker: from_profile_yaml\n")
    write(tmp_path / "old" / "config.yaml", "config:\n  marker: from_config_yaml\n")
    assert "MARKER from_profile_yaml" in said(smk(tmp_path, "-n", "--profile", "new"))
    assert "MARKER from_config_yaml" in said(smk(tmp_path, "-n", "--profile", "old/config.yaml"))


@pytest.mark.parametrize("where", ["default", "profiles/default", "workflow/profiles/default"])
def test_a_default_workflow_profile_is_picked_up(tmp_path: Path, where: str) -> None:
    """9.19.0: with the Snakefile in workflow/, any of ./default (new), ./profiles/default and
    workflow/profiles/default is loaded as the workflow profile without being asked for."""
    write(tmp_path / "workflow" / "Snakefile", MARKER)
    write(tmp_path / where / "config.yaml", "config:\n  marker: picked\n")
    proc = smk(tmp_path, "-n")
    assert "MARKER picked" in said(proc), said(proc)
    assert f"workflow specific profile {where}" in proc.stderr


def test_no_default_workflow_profile_ships() -> None:
    """9.19.0: none of the folders Snakemake would load unasked exists where our workflows run."""
    for workdir, snakefile in (
        (REPO, REPO / "workflow" / "Snakefile"),
        (REPO / "examples" / "digits", REPO / "examples" / "digits" / "Snakefile"),
    ):
        assert snakefile.is_file()
        for candidate in (
            workdir / "default",
            workdir / "profiles" / "default",
            snakefile.parent / "profiles" / "default",
        ):
            assert not candidate.exists(), f"{candidate} would be loaded as a workflow profile"


def test_site_workflow_profile_overrides_the_shipped_slurm_profile(tmp_path: Path) -> None:
    """9.19.0: the docs' recipe (docs/slurm.md, "Your cluster"), `--profile profiles/slurm --workflow-profile <site folder>`, still
    layers a site's default-resources over ours."""
    write(tmp_path / "Snakefile", MARKER)
    write(
        tmp_path / "site" / "config.yaml",
        "default-resources:\n  slurm_account: mylab\n  tasks_per_gpu: 0\n  slurm_extra: \"'--signal=TERM@90'\"\n",
    )
    proc = smk(
        tmp_path,
        "-n",
        "--profile",
        str(shipped_profile("slurm")),
        "--workflow-profile",
        str(tmp_path / "site"),
        env=without_slurm(tmp_path),
    )
    assert proc.returncode == 0, said(proc)
    assert f"workflow specific profile {tmp_path / 'site'}" in proc.stderr
    assert "slurm_account=mylab" in said(proc)


# --- 7. Dry runs validate against the intended executor (9.27.0) -----------------------------


def test_dry_run_with_the_slurm_profile_needs_no_slurm(tmp_path: Path) -> None:
    """9.27.0: `-n` now validates against the profile's executor, still without calling SLURM: the
    docs' dry-run promise (docs/slurm.md) holds (the digits example, no SLURM tool on PATH)."""
    project = Path(
        shutil.copytree(
            REPO / "examples" / "digits",
            tmp_path / "digits",
            ignore=shutil.ignore_patterns("results", "logs", ".snakemake", ".checkpoints", "__pycache__"),
        )
    )
    proc = smk(project, "-n", "--profile", str(shipped_profile("slurm")), env=without_slurm(tmp_path))
    assert proc.returncode == 0, said(proc)
    assert planned(proc) == {"prepare", "fit", "all"}, said(proc)
    assert "workflow specific profile" not in said(proc)


def test_dry_run_checks_the_executors_settings(tmp_path: Path) -> None:
    """9.27.0: a dry run now builds the intended executor's settings: a bad plugin setting fails `-n`,
    and so does a remote executor without --jobs (our profile sets `jobs`). 9.15 planned both."""
    write(tmp_path / "Snakefile", MARKER)
    env = without_slurm(tmp_path)
    executor = shipped_profile_settings("slurm")["executor"]
    bad = smk(
        tmp_path, "-n", "--profile", str(shipped_profile("slurm")), f"--{executor}-status-command", "bogus", env=env
    )
    assert bad.returncode != 0
    assert "Invalid status command" in said(bad), said(bad)
    no_jobs = smk(tmp_path, "-n", "--executor", executor, env=env)
    assert no_jobs.returncode != 0
    assert "maximum number of parallel jobs" in said(no_jobs), said(no_jobs)


# --- Terminal output (9.27.x): a failure is reported once --------------------------------------


def test_failed_rules_log_is_shown_once(tmp_path: Path) -> None:
    """9.27.x: failed jobs' errors are no longer repeated after "Exiting because a job execution
    failed" (now "Look above"); `show-failed-logs` (both our profiles) still prints the rule's log."""
    write(
        tmp_path / "Snakefile",
        """
        rule bad:
            output: "bad.txt"
            log: "logs/bad.log"
            shell: "echo LOG-OF-THE-FAILED-RULE > {log}; exit 3"
        """,
    )
    proc = smk(tmp_path, "-c1", "--show-failed-logs")
    assert proc.returncode != 0
    out = said(proc)
    assert "LOG-OF-THE-FAILED-RULE" in out
    assert out.count("Error in rule bad") == 1, out
    assert "Look above for error messages" in out
