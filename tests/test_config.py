from __future__ import annotations

import copy

import pytest
import yaml

from esol.config import TrainConfig, section
from snakedvc.engine.config import ConfigError, load_schema, validate_config
from tests.conftest import REPO, SCHEMA, run_snakemake


@pytest.fixture(scope="module")
def schema() -> dict:
    return load_schema(SCHEMA)


def test_shipped_params_are_valid_and_match_schema_defaults(schema: dict) -> None:
    from snakedvc.engine.workflow import kit_schema

    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    kit = raw.pop("snakedvc")  # the kit's section, checked against the kit's own schema
    assert validate_config(raw, schema) == validate_config({}, schema)
    assert validate_config(kit, kit_schema())["schema"] == "workflow/schemas/config.schema.yaml"


def test_every_schema_key_has_description_and_default(schema: dict) -> None:
    def walk(node: dict, path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            assert "description" in sub, f"{path}{key} has no description"
            assert "default" in sub, f"{path}{key} has no default"
            walk(sub, f"{path}{key}.")

    walk(schema, "")
    walk(schema["$defs"]["rule_resources"], "resources.*.")


def test_defaults_are_filled(schema: dict) -> None:
    cfg = validate_config({"train": {"lr": 0.01}}, schema)
    assert cfg["train"]["lr"] == 0.01
    assert cfg["train"]["batch_size"] == 64
    assert cfg["featurise"]["radius"] == 2
    assert cfg["resources"]["train"]["gpu"] == 1


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"train": {"learning_rate": 0.1}}, "train.learning_rate"),
        ({"bogus": 1}, "bogus"),
        ({"resources": {"train": {"gpus": 1}}}, "resources.train.gpus"),
    ],
)
def test_unknown_key_is_named(schema: dict, config: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown config key '{key}'"):
        validate_config(config, schema)


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"train": {"lr": "fast"}}, "train.lr"),
        ({"train": {"batch_size": 3.5}}, "train.batch_size"),
        ({"split": {"method": "stratified"}}, "split.method"),
        ({"featurise": {"radius": -1}}, "featurise.radius"),
        ({"train": {"hidden_sizes": []}}, "train.hidden_sizes"),
    ],
)
def test_wrong_type_or_value_is_named(schema: dict, config: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        validate_config(config, schema)


def test_fractions_must_sum_to_one(schema: dict) -> None:
    from esol.config import check_config

    with pytest.raises(ConfigError, match="split.fractions"):
        check_config(validate_config({"split": {"fractions": [0.5, 0.2, 0.2]}}, schema))


def test_validation_does_not_mutate_input(schema: dict) -> None:
    original = {"train": {"lr": 0.5}}
    snapshot = copy.deepcopy(original)
    validate_config(original, schema)
    assert original == snapshot


def test_section_builds_dataclass_from_a_whole_validated_section(schema: dict) -> None:
    train = validate_config({"train": {"hidden_sizes": [8, 4], "lr": 0.1}}, schema)["train"]
    cfg = section(TrainConfig, train)
    assert cfg.hidden_sizes == (8, 4) and cfg.lr == 0.1 and cfg.max_epochs == 100  # the schema's default
    with pytest.raises(ConfigError, match="missing max_epochs"):
        section(TrainConfig, {k: v for k, v in train.items() if k != "max_epochs"})
    with pytest.raises(ConfigError, match="unknown key.*nope"):
        section(TrainConfig, {**train, "nope": 1})


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (["--config", "train={lr: abc}"], "config key 'train.lr'"),
        (["--config", "typo_key=1"], "unknown config key 'typo_key'"),
    ],
)
def test_bad_config_fails_before_any_job(project, override: list[str], expected: str) -> None:
    proc = run_snakemake(project, "--profile", "profiles/local", *override, check=False)
    assert proc.returncode != 0
    assert expected in proc.stderr + proc.stdout
    assert not (project / "results").exists(), "a job ran although the config was invalid"


def test_bad_params_file_fails_naming_key(project) -> None:
    params = yaml.safe_load((project / "config/config.yaml").read_text())
    params["featurise"]["n_bit"] = 1024
    (project / "config/config.yaml").write_text(yaml.safe_dump(params))
    proc = run_snakemake(project, "-n", check=False)
    assert proc.returncode != 0
    assert "featurise.n_bit" in proc.stderr + proc.stdout


def test_numeric_strings_from_command_line_are_coerced(schema: dict) -> None:
    cfg = validate_config({"data": {"limit": "200"}, "train": {"lr": "0.01", "hidden_sizes": ["32", "8"]}}, schema)
    assert cfg["data"]["limit"] == 200 and cfg["train"]["lr"] == 0.01
    assert cfg["train"]["hidden_sizes"] == [32, 8]
    with pytest.raises(ConfigError, match="train.lr"):
        validate_config({"train": {"lr": "fast"}}, schema)


def test_the_kits_settings_classes_name_exactly_the_schemas_keys_and_hold_no_defaults() -> None:
    import dataclasses

    from snakedvc.engine import settings

    def check(cls: type, schema: dict) -> None:
        fields = dataclasses.fields(cls)
        assert [f.name for f in fields] == list(schema["properties"]), cls
        assert all(f.default is dataclasses.MISSING for f in fields), f"{cls.__name__} repeats a default"
        for field in fields:
            hint = cls.__annotations__[field.name]
            section = getattr(settings, str(hint), None)
            if dataclasses.is_dataclass(section):
                check(section, schema["properties"][field.name])

    check(settings.Settings, settings.schema("snakedvc"))
    check(settings.ControllerSettings, settings.schema("controller"))
    frozen = settings.settings({"snakedvc": {"sweep": {"metric": "loss"}}})
    assert frozen.sweep.metric == "loss" and frozen.experiment.metrics == () and frozen.tracking is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.sweep.metric = "other"  # type: ignore[misc]


def test_the_esol_steps_configs_name_exactly_the_schemas_keys_and_hold_no_defaults(schema: dict) -> None:
    import dataclasses

    from esol.config import FeaturiseConfig, SplitConfig

    for cls, key in ((SplitConfig, "split"), (FeaturiseConfig, "featurise"), (TrainConfig, "train")):
        fields = dataclasses.fields(cls)
        assert {f.name for f in fields} == set(schema["properties"][key]["properties"]), cls
        assert all(f.default is dataclasses.MISSING for f in fields), f"{cls.__name__} repeats a default"


def test_controller_yaml_goes_through_the_schema(tmp_path) -> None:
    from snakedvc.engine.settings import controller_settings

    assert controller_settings(tmp_path).runtime == 10080  # no file: every default
    (tmp_path / "controller.yaml").write_text("partition: long\nsbatch_extra: [--qos=long]\nretries: 0\n")
    job = controller_settings(tmp_path)
    assert (job.partition, job.sbatch_extra, job.retries, job.cpus) == ("long", ("--qos=long",), 0, 1)
    (tmp_path / "controller.yaml").write_text("retries: -1\n")
    with pytest.raises(ConfigError, match=r"controller.yaml: config key 'retries'.*minimum"):
        controller_settings(tmp_path)
