# Validation of the config, and tiny helpers the rules share. Logic lives in src/snakedvc.
import json
import shlex
from pathlib import Path

from snakemake.exceptions import WorkflowError

import snakedvc
from esol.cli import print_summary
from esol.config import check_config
from snakedvc.config import load_schema
from snakedvc.sweep import SweepPlan
from snakedvc.tracking import finish_sweep

try:
    check_config(config)
    # The sweep's trials and rungs, fixed before any job runs (promotion is decided at run time).
    SWEEP = (
        SweepPlan.from_config(config, load_schema(config["snakedvc"]["schema"])) if config["sweep"]["enabled"] else None
    )
except snakedvc.ConfigError as error:
    raise WorkflowError(f"invalid config (config/config.yaml or --config): {error}") from None

SPLITS = ["train", "valid", "test"]
SWEEP_NAME = SWEEP.name if SWEEP else "none"
SWEEP_DIR = f"results/sweeps/{SWEEP_NAME}"


def section_json(*names):
    """The named config sections as sorted JSON: passed to a step, and a rerun trigger."""
    if len(names) == 1:
        return json.dumps(config[names[0]], sort_keys=True)
    return json.dumps({name: config[name] for name in names}, sort_keys=True)


def tracked_outputs():
    """The .dvc files that record this run's outputs in DVC (none where tracking is off)."""
    if SWEEP is not None:
        return snakedvc.tracked(config, rules.sweep_report.output.report)
    features = expand("results/features/{split}.{ext}", split=SPLITS, ext=["npz", "rejects.csv"])
    return snakedvc.tracked(
        config,
        rules.split.output,
        features,
        [rules.train.output.model, rules.train.output.history],
    )


def end_of_run(cfg):
    if SWEEP is not None:
        report_dir = Path(SWEEP_DIR) / "report"
        if (report_dir / "summary.txt").is_file():  # absent when only other targets were asked for
            print((report_dir / "summary.txt").read_text())
            finish_sweep(cfg, SWEEP, report_dir)
        return
    print_summary("results/metrics.json")
    snakedvc.finish_run(cfg)


def feature_shards(split, ext):
    """The shard files gather_features concatenates, in order."""
    shards = config["featurise"]["shards"]
    return [f"results/features/shards/{split}/{i}-of-{shards}.{ext}" for i in range(shards)]


def featurise_output(ext):
    """A split's features (one shard: nothing to gather), else one shard's, kept until gathered."""
    if config["featurise"]["shards"] == 1:
        return f"results/features/{{split}}.{ext}"
    return temp(f"results/features/shards/{{split}}/{{shard}}-of-{{shards}}.{ext}")


def featurise_log(folder, ext="log"):
    if config["featurise"]["shards"] == 1:
        return f"{folder}/{{split}}.{ext}"
    return f"{folder}/{{split}}/{{shard}}-of-{{shards}}.{ext}"


def res(rule_name, key):
    """A portable resource of a rule from the config's resources section."""
    return config["resources"][rule_name].get(key, 0)


# Sweeps (rules/sweep.smk): where a trial's features and rung outputs live, who runs in a rung.
def sweep_features(trial, split):
    key = SWEEP.features_key(trial)
    if key is None:  # the workflow's own features
        return f"results/features/{split}.npz"
    return f"{SWEEP_DIR}/features/{key}/{split}.npz"


def trial_dir(trial, rung):
    return f"{SWEEP_DIR}/trials/{trial}/rung{rung}"


def rung_trials(rung):
    """The trials trained in a rung: all valid ones first, then the previous rung's survivors."""
    if rung == 0:
        return [trial.id for trial in SWEEP.valid_trials]
    decision = checkpoints.sweep_rung.get(rung=str(rung - 1)).output.decision
    with open(decision) as handle:
        return json.load(handle)["survivors"]


def best_trial_dir(wildcards):
    last = len(SWEEP.rungs) - 1
    decision = checkpoints.sweep_rung.get(rung=str(last)).output.decision
    with open(decision) as handle:
        ranking = json.load(handle)["ranking"]
    if not ranking:
        raise WorkflowError(f"sweep {SWEEP.name}: every trial failed; see {SWEEP_DIR}/rungs/")
    return trial_dir(ranking[0], last)
