"""Bad input, generated: every numeric setting of every command's configuration dataclass at 0, -1
and a huge value, and path settings given a file where a directory is expected (and the reverse).
Each value is accepted inside the range its field declares, or refused naming the setting with
nothing written (the command run for real on the refused value). Then the cases a careful user
once hit: outputs that deleted their files, settings an ablation replaced silently, silent wrong
values, tracebacks, and traces left by refused runs."""

from __future__ import annotations

import dataclasses
import re
import types
import typing

import h5py
import numpy as np
import pytest
import yaml

from minivla_wmrl.ablation import AblationRecipe, check_ablation
from minivla_wmrl.cli import main as cli
from minivla_wmrl.data.demos import DemosCommand
from minivla_wmrl.data.trajectories import ExportCommand
from minivla_wmrl.evaluation.evaluate import EvalConfig
from minivla_wmrl.infra.config import InputPath, _constraints, apply_overrides, config_from_dict
from minivla_wmrl.infra.outputs import MARK
from minivla_wmrl.pipeline import PipelineRecipe
from minivla_wmrl.train.grpo import GRPORecipe
from minivla_wmrl.train.sft import SFTRecipe
from minivla_wmrl.train.vq import VQCommand
from minivla_wmrl.train.wm import WMRecipe

HUGE = 10**20
VALUES = (0, -1, HUGE)


def leaf_settings(cls, prefix: str = ""):
    """(dotted key, declared type with its annotations, the dataclass holding it) of every leaf of `cls`."""
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(_constraints(hints[f.name])[0]):
            yield from leaf_settings(_constraints(hints[f.name])[0], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", hints[f.name], cls


def numeric_settings(cls):
    """(dotted key, declared ranges, the dataclass holding it) of every int/float leaf of `cls`."""
    for key, declared, holder in leaf_settings(cls):
        hint, ranges = _constraints(declared)
        options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else [hint]
        if any(o in (int, float) for o in options):
            yield key, ranges, holder


# command → (its configuration dataclass, how a setting is given, the arguments that start it in `tmp`)
RECIPE_COMMANDS = {"run": PipelineRecipe, "ablate": AblationRecipe, "sft": SFTRecipe, "wm": WMRecipe,
                   "grpo": GRPORecipe}
FLAG_COMMANDS = {
    "eval": (EvalConfig, ["eval", "--checkpoint", "{tmp}/checkpoint", "--suite", "libero_90", "--out", "{tmp}/out"]),
    "vq": (VQCommand, ["vq", "--data", "{tmp}/demos", "--out", "{tmp}/out"]),
    "demos": (DemosCommand, ["demos", "--tasks", "0", "--out", "{tmp}/out"]),
    "export": (ExportCommand, ["export", "{tmp}/rollouts.hdf5", "--out", "{tmp}/out"]),
}
CONFIGS = {**RECIPE_COMMANDS, **{c: cls for c, (cls, _) in FLAG_COMMANDS.items()}}
CASES = [(c, key, ranges, holder) for c, cls in CONFIGS.items() for key, ranges, holder in numeric_settings(cls)
         if c != "ablate" or key.startswith("ablation.")]  # the rest of an ablation recipe is the pipeline's


def test_every_command_has_numeric_settings_to_try():
    counts = {c: sum(1 for case in CASES if case[0] == c) for c in CONFIGS}
    assert all(counts.values()) and counts["run"] > 90, counts


def _build(command: str, key: str, value):
    """The command's configuration with one setting changed, as its recipe or flags would give it."""
    if command in RECIPE_COMMANDS:
        return config_from_dict(RECIPE_COMMANDS[command], apply_overrides({}, [f"{key}={value}"]), command)
    cls, _ = FLAG_COMMANDS[command]
    hints = typing.get_type_hints(cls, include_extras=True)
    required = {f.name: ["x"] if typing.get_origin(_constraints(hints[f.name])[0]) is list else "x"
                for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    return config_from_dict(cls, required | {key: value}, command)


def _run_refused(command: str, key: str, value, tmp_path, capsys) -> str:
    """Run the command for real with the refused value; returns its error. Nothing may be written."""
    before = sorted(tmp_path.rglob("*"))
    if command in RECIPE_COMMANDS:
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text("{}\n")
        before = sorted(tmp_path.rglob("*"))
        args = [command, str(recipe), f"{key}={value}", f"out={tmp_path / 'out'}"]
    else:
        flag = f"--{key.replace('_', '-')}"
        args = [a.format(tmp=tmp_path) for a in FLAG_COMMANDS[command][1]] + [flag, str(value)]
    assert cli(args) == 1, args
    assert sorted(tmp_path.rglob("*")) == before, f"{args} wrote {set(tmp_path.rglob('*')) - set(before)}"
    return capsys.readouterr().err


@pytest.mark.parametrize("command, key, ranges, holder", CASES, ids=[f"{c}:{k}" for c, k, _, _ in CASES])
def test_numeric_settings_are_in_range_or_refused_by_name(command, key, ranges, holder, tmp_path, capsys):
    for value in VALUES:
        try:
            _build(command, key, value)
        except ValueError as error:
            leaf = key.rsplit(".", 1)[-1]
            assert leaf in str(error), f"{command} {key}={value}: the error does not name the setting: {error}"
            assert leaf in _run_refused(command, key, value, tmp_path, capsys)
            continue
        # accepted: the field declares the range that admits it (a world model's sizes check themselves)
        assert ranges or "__post_init__" in vars(holder), f"{command} {key}={value} accepted with no declared range"
        for r in ranges:
            r.check(value, key)
        assert value != -1, f"{command} {key}=-1 accepted: no setting of ours means anything negative"


def _demo_file(path):
    with h5py.File(path, "w") as f:
        f.create_group("data").attrs["problem_info"] = '{"language_instruction": "x"}'


@pytest.mark.parametrize("command", ["run", "sft", "wm", "grpo", "eval", "vq", "demos", "export"])
def test_an_output_directory_that_is_a_file_is_refused_with_nothing_written(command, tmp_path, capsys):
    out = tmp_path / "taken"
    out.write_text("someone's file")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"suite": "libero_90", "demos": {"generate": True}} if command == "run" else {}))
    (tmp_path / "checkpoint").mkdir()  # the inputs the flag commands name: they pass, the output is refused
    (tmp_path / "demos").mkdir()
    _valid_demo(tmp_path / "demos" / "a_demo.hdf5")
    _rollouts(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    args = ([command, str(recipe), f"out={out}"] if command in RECIPE_COMMANDS else
            [a.format(tmp=tmp_path) for a in FLAG_COMMANDS[command][1][:-1]] + [str(out)])
    assert cli(args) == 1
    assert f"{out} is an existing file, not a directory" in capsys.readouterr().err
    assert out.read_text() == "someone's file" and sorted(tmp_path.rglob("*")) == before


def path_settings(cls):
    """(dotted key, its kind, whether it is a list) of every input path setting of `cls`."""
    for key, declared, _ in leaf_settings(cls):
        extras = typing.get_args(declared)[1:] if typing.get_origin(declared) is typing.Annotated else ()
        for extra in extras:
            if isinstance(extra, InputPath):
                yield key, extra.kind, typing.get_origin(_constraints(declared)[0]) is list


RECIPE_INPUTS = {"sft": {"data": {"paths": ["{demo}"]}}, "wm": {"data": {"demos": ["{demo}"]}}, "grpo": {},
                 "run": {"data": ["{demo}"]}}
PATH_CASES = [(c, key, kind, many) for c, cls in CONFIGS.items() for key, kind, many in path_settings(cls)
              if c != "ablate"]  # an ablation recipe's input paths are the pipeline's


def _valid_demo(path):
    """A LIBERO-layout demonstration file (no simulator needed): 16 moving actions and their frames."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = '{"language_instruction": "close the drawer"}'
        demo = data.create_group("demo_0")
        demo["actions"] = np.concatenate([rng.uniform(-0.5, 0.5, (16, 6)), np.ones((16, 1))], axis=1)
        demo["obs/agentview_rgb"] = rng.integers(0, 255, (16, 32, 32, 3), np.uint8)
    return path


def test_every_input_path_setting_is_found():
    found = {(c, key) for c, key, _, _ in PATH_CASES}
    assert {("sft", "vq.path"), ("sft", "policy.init_checkpoint"), ("wm", "data.rollouts"),
            ("wm", "collect.checkpoint"), ("grpo", "policy.checkpoint"), ("run", "weights.qwen_dir"),
            ("run", "sft.data.paths"), ("eval", "checkpoint"), ("vq", "data"), ("export", "trajectories")} <= found


@pytest.mark.parametrize("command, key, kind, many", PATH_CASES, ids=[f"{c}:{k}" for c, k, _, _ in PATH_CASES])
def test_input_paths_of_the_wrong_kind_are_refused_by_name_with_nothing_written(command, key, kind, many, tmp_path,
                                                                                capsys):
    demo = _valid_demo(tmp_path / "demo.hdf5")
    (tmp_path / "a_file.txt").write_text("x")
    (tmp_path / "a_dir").mkdir()
    wrong = {"dir": tmp_path / "a_file.txt", "file": tmp_path / "a_dir", "either": tmp_path / "missing"}[kind]
    if command in RECIPE_COMMANDS:
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(yaml.safe_dump(RECIPE_INPUTS[command]).replace("{demo}", str(demo)))
        args = [command, str(recipe), f"{key}={f'[{wrong}]' if many else wrong}", f"out={tmp_path / 'out'}"]
    else:  # the flag's value replaced (export's trajectories are its positional arguments)
        args = [a.format(tmp=tmp_path) for a in FLAG_COMMANDS[command][1]]
        flag = f"--{key.replace('_', '-')}"
        args[args.index(flag) + 1 if flag in args else 1] = str(wrong)
    before = sorted(tmp_path.rglob("*"))
    assert cli(args) == 1
    error = capsys.readouterr().err
    assert str(wrong.name) in error, f"{command} {key}={wrong.name}: the error does not name it: {error}"
    assert sorted(tmp_path.rglob("*")) == before, f"{command} {key} wrote {set(tmp_path.rglob('*')) - set(before)}"


# -- the cases a careful user hit ------------------------------------------------------------------------


def _rollouts(tmp_path):
    from minivla_wmrl.data.trajectories import LabelledTrajectory, save_trajectories

    frames = np.zeros((3, 8, 8, 3), np.uint8)
    save_trajectories(tmp_path / "rollouts.hdf5", [LabelledTrajectory(frames, "open it", True, "rollout", "0")])
    return tmp_path / "rollouts.hdf5"


def test_export_never_deletes_a_directory_it_did_not_write(tmp_path, capsys):
    rollouts = _rollouts(tmp_path)
    mine = tmp_path / "mydata"
    mine.mkdir()
    (mine / "notes.txt").write_text("a week of work")
    assert cli(["export", str(rollouts), "--out", str(mine)]) == 1
    assert "holds files this command did not write (notes.txt)" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "a week of work" and len(list(tmp_path.iterdir())) == 2
    assert cli(["export", str(rollouts), "--out", str(tmp_path / "export")]) == 0  # a new directory
    assert (tmp_path / "export" / MARK).exists()
    assert cli(["export", str(rollouts), "--out", str(tmp_path / "export")]) == 0  # its own: replaced
    assert cli(["export", str(rollouts), "--out", str(mine), "--overwrite"]) == 0  # asked for by name
    assert not (mine / "notes.txt").exists() and (mine / "meta" / "info.json").exists()


def test_a_command_does_not_take_over_another_commands_output(tmp_path, capsys):
    rollouts = _rollouts(tmp_path)
    assert cli(["export", str(rollouts), "--out", str(tmp_path / "export")]) == 0
    demo = _valid_demo(tmp_path / "demo.hdf5")
    assert cli(["vq", "--data", str(demo), "--out", str(tmp_path / "export")]) == 1
    assert "already holds `export`'s output" in capsys.readouterr().err


def test_an_ablation_arm_may_not_set_what_every_cell_shares():
    def recipe(arms, seeds=(0,)):
        data = {"out": "runs/x", "grpo": {"policy": {"checkpoint": "sft"}},
                "ablation": {"seeds": list(seeds), "arms": arms}}
        return config_from_dict(AblationRecipe, data, "recipe")

    for override in ("grpo.seed=5", "out=/elsewhere", "policy.checkpoint=other", "env.tasks=[1]"):
        with pytest.raises(ValueError, match=f"overrides \\['{override.split('=')[0]}'\\]: the ablation sets"):
            check_ablation(recipe([{"name": "a", "overrides": [override]}]))
    for seeds in ([-1], [10**20], [2**32 - 1000]):
        with pytest.raises(ValueError, match="out of range; expected 0 <= seed <"):
            check_ablation(recipe([{"name": "a"}, {"name": "b"}], seeds))


def test_silent_wrong_values_are_refused(tmp_path):
    from envs.libero_env import LiberoEnv
    from minivla_wmrl.data.dataset import read_episodes

    with pytest.raises(ValueError, match="resolution: 0 is out of range"):
        _build("demos", "resolution", 0)
    with pytest.raises(ValueError, match="camera resolution must be >= 1"):
        LiberoEnv("libero_90", 0, resolution=0)  # before the simulator starts
    demos = tmp_path / "demos"
    demos.mkdir()
    _demo_file(demos / "a_demo.hdf5")
    with pytest.raises(ValueError, match="is named twice"):
        read_episodes([demos, demos], image_key=None)
    with pytest.raises(ValueError, match="is named twice"):
        read_episodes([demos, demos / "a_demo.hdf5"], image_key=None)
    with pytest.raises(ValueError, match="max_demos_per_file: -1 is out of range"):
        config_from_dict(SFTRecipe, {"data": {"max_demos_per_file": -1}}, "sft")


@pytest.mark.parametrize("args, message", [
    (["demos", "--tasks", "0", "--out", "{tmp}/d", "--max-episodes", "0"], "max_episodes: 0 is out of range"),
    (["demos", "--tasks", "0", "--out", "{tmp}/d", "--format", "lerobot", "--max-episodes", "0"],
     "max_episodes: 0 is out of range"),
    (["demos", "--tasks", "999", "--out", "{tmp}/d"], "999"),
    (["sft", "{tmp}/recipe.yaml", "out={tmp}/s", "data.paths=[]"], "data.paths (vq --data) is empty"),
    (["sft", "{tmp}/recipe.yaml", "out={tmp}/s", "data.chunk_len=0"], "chunk_len: 0 is out of range"),
    (["sft", "{tmp}/recipe.yaml", "out={tmp}/s", "data.paths=[{tmp}/missing.hdf5]"], "missing.hdf5 does not exist"),
    (["vq", "--data", "{tmp}/x.hdf5", "--out", "{tmp}/v", "--chunk-len", "0"], "chunk_len: 0 is out of range"),
    (["vq", "--data", "{tmp}/x.hdf5", "--out", "{tmp}/v", "--seed", "-3"], "seed: -3 is out of range"),
    (["eval", "--checkpoint", "{tmp}", "--suite", "libero_90", "--out", "{tmp}/e", "--backend", "ray",
      "--envs-per-worker", "2"], "envs_per_worker=2 needs the 'local' backend"),
    # a directory where a file goes, and the reverse
    (["export", "{tmp}", "--out", "{tmp}/out"], "is a directory"),
    (["eval", "--checkpoint", "{tmp}/recipe.yaml", "--suite", "libero_90", "--out", "{tmp}/out"], "recipe.yaml"),
    (["compare", "{tmp}/a", "{tmp}/b", "--json", "{tmp}"], "is a directory; expected a file path"),
    (["bench", "policy", "--json", "{tmp}"], "is a directory; expected a file path"),
])
def test_refusals_are_named_before_anything_is_written(args, message, tmp_path, capsys):
    (tmp_path / "recipe.yaml").write_text("{}\n")
    before = sorted(tmp_path.rglob("*"))
    assert cli([a.format(tmp=tmp_path) for a in args]) == 1
    assert message in capsys.readouterr().err
    assert sorted(tmp_path.rglob("*")) == before


def test_compare_refuses_a_json_directory_before_printing(tmp_path, capsys):
    assert cli(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "is a directory; expected a file path" in captured.err


def test_saving_a_model_never_deletes_a_directory_it_did_not_write(tmp_path):
    from minivla_wmrl.policy.action_tokenizer import ActionTokenizer, ActionTokenizerConfig

    tokenizer = ActionTokenizer(ActionTokenizerConfig(chunk_len=2, latent_dim=4, hidden_dim=8, codebook_size=4))
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / "config.json").write_text("{}")  # e.g. someone's Hub download
    with pytest.raises(FileExistsError, match="save_pretrained: output directory .*downloads already holds files"):
        tokenizer.save_pretrained(downloads)
    assert [p.name for p in downloads.iterdir()] == ["config.json"]
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    tokenizer.save_pretrained(tmp_path / "tokenizer")  # its own earlier save: replaced
    assert ActionTokenizer.from_pretrained(tmp_path / "tokenizer").config == tokenizer.config


def test_outputs_of_versions_before_marks_are_known_by_what_their_command_wrote(tmp_path):
    from minivla_wmrl.infra.outputs import OutputExistsError, check_output_dir

    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "recipe.json").write_text("{}")  # an sft run of an earlier version: no mark
    assert check_output_dir(tmp_path / "sft", "sft") == tmp_path / "sft"
    with pytest.raises(OutputExistsError, match="vq: output directory .*sft already holds files"):
        check_output_dir(tmp_path / "sft", "vq")
    (tmp_path / "ablation" / "eval" / "sft").mkdir(parents=True)  # an interrupted ablation: its SFT evaluation
    assert check_output_dir(tmp_path / "ablation", "ablate") == tmp_path / "ablation"
    for name in ("demos", "vq", "sft", "wm"):  # stage outputs copied into a new pipeline directory to start from
        (tmp_path / "run" / name).mkdir(parents=True)
    assert check_output_dir(tmp_path / "run", "pipeline") == tmp_path / "run"
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="notes.txt"):
        check_output_dir(tmp_path / "run", "pipeline")


def test_a_directory_setting_takes_a_hub_repo_id_but_not_a_missing_path():
    InputPath("dir").check("openvla/minivla", "policy.checkpoint")  # owner/name: downloaded when loaded
    for missing in ("./openvla/minivla", "/no/such", "~/x/y", "a/b/c"):
        with pytest.raises(FileNotFoundError, match=f"policy.checkpoint: {re.escape(missing)} does not exist"):
            InputPath("dir").check(missing, "policy.checkpoint")
    with pytest.raises(FileNotFoundError, match="expected a file"):
        InputPath("file").check("openvla/minivla", "data.path")
