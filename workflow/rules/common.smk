# Validation of the config, and tiny helpers the rules share. Logic lives in src/snakedvc.
import json
from pathlib import Path

from snakemake.exceptions import WorkflowError

from snakedvc.config import ConfigError, load_schema, validate_config
from snakedvc.cli import print_summary
from snakedvc.env import use_this_interpreter
from snakedvc.tracking import finish_run, is_dvc_repo

try:
    _validated = validate_config(
        config, load_schema(Path(workflow.basedir) / "schemas" / "config.schema.yaml")
    )
except ConfigError as error:
    raise WorkflowError(f"invalid config (params.yaml or --config): {error}") from None
# In place, so every rule and Snakemake itself see the defaults.
config.clear()
config.update(_validated)

use_this_interpreter()
SPLITS = ["train", "valid", "test"]


def section_json(*names):
    """The named config sections as sorted JSON: passed to a step, and a rerun trigger."""
    if len(names) == 1:
        return json.dumps(config[names[0]], sort_keys=True)
    return json.dumps({name: config[name] for name in names}, sort_keys=True)


def dvc_files(paths):
    return [f"{path}.dvc" for path in paths]


def tracked_outputs():
    """The .dvc files the workflow targets; none where tracking is off or this is no DVC repo."""
    if not (config["tracking"]["enabled"] and is_dvc_repo()):
        return []
    return [
        *dvc_files(rules.split.output),
        *expand("results/features/{split}.{ext}.dvc", split=SPLITS, ext=["npz", "rejects.csv"]),
        *dvc_files([rules.train.output.model, rules.train.output.history]),
        *dvc_files([rules.evaluate.output.parity]),
    ]


def end_of_run(cfg):
    print_summary("results/metrics.json")
    finish_run(cfg)


def res(rule_name, key):
    """A portable resource of a rule from the config's resources section."""
    return config["resources"][rule_name].get(key, 0)
