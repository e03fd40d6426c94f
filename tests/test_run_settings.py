"""Settings that used to go silently wrong: override values with `#`, checkpoint directory names."""

import pytest

from minivla_wmrl.infra.config import apply_overrides
from minivla_wmrl.infra.run_checkpoint import latest_checkpoint


@pytest.mark.parametrize("raw, expected", [
    ("runs/exp #2", "runs/exp #2"),  # YAML would read "runs/exp" and two runs would share a directory
    ("runs/exp #3", "runs/exp #3"),
    ("'#quoted'", "#quoted"),
    ("a#b", "a#b"),
    ("3", 3), ("0.5", 0.5), ("true", True), ("[1, 2]", [1, 2]),
])
def test_override_values_keep_every_character_typed(raw, expected):
    assert apply_overrides({}, [f"out={raw}"])["out"] == expected


def test_bad_override_syntax_is_named():
    with pytest.raises(ValueError, match="is not key=value"):
        apply_overrides({}, ["out"])
    with pytest.raises(ValueError, match="not valid YAML"):
        apply_overrides({}, ["out=[1, 2"])


def test_only_exact_step_directories_are_checkpoints(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    for name in ("step_0000040", "step_0000080.bak2", "step_final", "step_0000060"):
        (checkpoints / name).mkdir(parents=True)
    (checkpoints / "step_0000900").write_text("a file, not a checkpoint")
    assert latest_checkpoint(tmp_path).name == "step_0000060"  # not 802 (".bak2"), no int("final") crash
    assert latest_checkpoint(tmp_path / "empty") is None


def test_declared_ranges_and_choices_are_enforced_when_read_and_before_work(tmp_path):
    from minivla_wmrl.data.demos import generate_demos
    from minivla_wmrl.infra.config import check_config, config_from_dict
    from minivla_wmrl.train.grpo import GRPORecipe, validate
    from minivla_wmrl.train.sft import SFTRecipe, train_sft
    from minivla_wmrl.train.vq import VQTrainConfig, run_vq

    for data, message in (({"data": {"val_fraction": 1.5}},
                           r"sft.data.val_fraction: 1.5 is out of range; expected >= 0 and < 1"),
                          ({"data": {"val_fraction": -0.1}}, "val_fraction: -0.1 is out of range"),
                          ({"policy": {"dtype": "float16"}},
                           r"policy.dtype: 'float16' is not one of \['float32', 'bfloat16'\]"),
                          ({"sft": {"save_every": 0}}, "save_every: 0 is out of range; expected >= 1"),
                          ({"sft": {"batch_size": 0}}, "batch_size: 0 is out of range"),
                          ({"sft": {"steps": -1}}, "steps: -1 is out of range; expected >= 0")):
        with pytest.raises(ValueError, match=message):
            config_from_dict(SFTRecipe, data, "sft")
    for data, message in (
            ({"grpo": {"max_real_steps": 0}}, "max_real_steps: 0 is out of range"),  # ran 400-step episodes
            ({"grpo": {"steps": -1}}, "steps: -1 is out of range"),  # started the simulator
            ({"policy": {"dtype": "float16"}}, "'float16' is not one of")):  # was a KeyError
        with pytest.raises(ValueError, match=message):
            config_from_dict(GRPORecipe, data, "grpo")
    built = GRPORecipe()  # set in code, not read: checked before any work all the same
    built.policy.checkpoint, built.grpo.max_real_steps = "somewhere", 0
    with pytest.raises(ValueError, match="grpo recipe.grpo.max_real_steps: 0 is out of range"):
        validate(built)
    sft = SFTRecipe(out=str(tmp_path / "sft"))
    sft.sft.steps = -1
    with pytest.raises(ValueError, match="sft recipe.sft.steps: -1"):
        train_sft(sft)
    with pytest.raises(ValueError, match="vq settings.steps: -3 is out of range"):
        run_vq([], tmp_path / "vq", VQTrainConfig(steps=-3))
    with pytest.raises(ValueError, match="num must be >= 1"):
        generate_demos("libero_90", 0, 0, tmp_path / "demos")
    assert not any(tmp_path.iterdir())  # nothing was written
    check_config(GRPORecipe())  # the defaults are in range
