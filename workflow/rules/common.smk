# Validation of the config, and tiny helpers the rules share. Logic lives in src/snakedvc.
import json
from pathlib import Path

from snakemake.exceptions import WorkflowError

from snakedvc.config import ConfigError, load_schema, validate_config
from snakedvc.env import use_this_interpreter

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


wildcard_constraints:
    split="|".join(SPLITS),


def section_json(*names):
    """The named config sections as sorted JSON: passed to a step, and a rerun trigger."""
    if len(names) == 1:
        return json.dumps(config[names[0]], sort_keys=True)
    return json.dumps({name: config[name] for name in names}, sort_keys=True)


def res(rule_name, key):
    """A portable resource of a rule from the config's resources section."""
    return config["resources"][rule_name].get(key, 0)
