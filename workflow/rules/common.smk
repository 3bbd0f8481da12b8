# Validation of the config, and tiny helpers the rules share. Logic lives in src/snakedvc.
import json
import shutil
from pathlib import Path

from snakemake.exceptions import WorkflowError

import snakedvc
from esol.cli import print_summary
from esol.config import check_config

try:
    check_config(config)
    # The sweep's trials and rungs (config snakedvc.sweep), fixed before any job runs;
    # promotion is decided at run time by the kit's sweep module.
    SWEEP = snakedvc.sweep_plan(config)
except snakedvc.ConfigError as error:
    raise WorkflowError(f"invalid config (config/config.yaml or --config): {error}") from None

# The steps' Python (config `python`), found before any job starts rather than in every job's log.
if shutil.which(config["python"]) is None:
    raise WorkflowError(
        f"config python: {config['python']!r} is not an executable Python here (working directory "
        f"{Path.cwd()}): run `make setup`, which creates .venv-esol, or set python to an interpreter "
        "with the esol package's `steps` extra installed."
    )

SPLITS = ["train", "valid", "test"]


def section_json(*names):
    """The named config sections as sorted JSON: passed to a step, and a rerun trigger."""
    if len(names) == 1:
        return json.dumps(config[names[0]], sort_keys=True)
    return json.dumps({name: config[name] for name in names}, sort_keys=True)


# config `loading.stream`: features written uncompressed, training reading the featurise shards.
STREAM = config["loading"]["stream"]
STORED = "--stored" if STREAM else ""


def gathered_splits():
    """The splits whose features are one file: all, except the ones training streams from shards."""
    if STREAM and config["featurise"]["shards"] > 1:
        return ["test"]
    return SPLITS


def split_features(split):
    """What training reads of a split: its features file, or its shards when it streams them."""
    if split in gathered_splits():
        return f"results/features/{split}.npz"
    return feature_shards(split, "npz")


def tracked_outputs():
    """The .dvc files that record this run's outputs in DVC (none where tracking is off)."""
    if SWEEP.enabled:
        return snakedvc.tracked(config, SWEEP.report)
    features = expand("results/features/{split}.{ext}", split=gathered_splits(), ext=["npz", "rejects.csv"])
    return snakedvc.tracked(
        config,
        rules.split.output,
        features,
        rules.train.output.model,
    )


def end_of_run(cfg):
    if SWEEP.enabled:
        summary = Path(SWEEP.report) / "summary.txt"
        if summary.is_file():  # absent when only other targets were asked for
            print(summary.read_text())
    else:
        print_summary("results/metrics.json")
    snakedvc.finish_run(cfg, workflow)


def feature_shards(split, ext):
    """The shard files gather_features concatenates, in order."""
    shards = config["featurise"]["shards"]
    return [f"results/features/shards/{split}/{i}-of-{shards}.{ext}" for i in range(shards)]


def featurise_output(ext):
    """A split's features (one shard: nothing to gather), else one shard's, kept until gathered
    (and kept for good when training streams the shards)."""
    if config["featurise"]["shards"] == 1:
        return f"results/features/{{split}}.{ext}"
    shard = f"results/features/shards/{{split}}/{{shard}}-of-{{shards}}.{ext}"
    return shard if STREAM else temp(shard)


def featurise_log(folder, ext="log"):
    if config["featurise"]["shards"] == 1:
        return f"{folder}/{{split}}.{ext}"
    return f"{folder}/{{split}}/{{shard}}-of-{{shards}}.{ext}"


def res(rule_name, key):
    """A portable resource of a rule from the config's resources section."""
    return config["resources"][rule_name].get(key, 0)


# Sweeps (rules/sweep.smk): a trial's features are the workflow's own unless it changes featurise.
def sweep_features(trial, split):
    variant = SWEEP.section_variant(trial, "featurise")
    if variant is None:
        return f"results/features/{split}.npz"
    return f"{SWEEP.root}/features/{variant}/{split}.npz"
