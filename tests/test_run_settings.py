"""Settings that used to go silently wrong: override values with `#`, checkpoint directory names."""

import pytest

from minivla_wmrl.config import apply_overrides
from minivla_wmrl.run_log import latest_checkpoint


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
