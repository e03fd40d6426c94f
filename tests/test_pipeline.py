"""Recipes: every shipped recipe validates on the meta device; the gymnasium recipe runs end to end."""

import json
import re
from pathlib import Path

import imageio.v2 as imageio
import pytest

from minivla_wmrl.cli import main as cli

RECIPES = sorted(Path("recipes").glob("*.yaml"))
PIPELINE_RECIPES = [r for r in RECIPES if not r.name.startswith("sft_")]


@pytest.mark.parametrize("recipe", PIPELINE_RECIPES, ids=lambda p: p.stem)
def test_every_recipe_passes_a_dry_run(recipe, capsys):
    from envs.libero_env import get_suite
    from minivla_wmrl.infra.config import load_recipe
    from minivla_wmrl.pipeline import PipelineRecipe, dry_run
    from minivla_wmrl.policy.config import preset
    from minivla_wmrl.policy.info import parameter_counts

    assert cli(["run", str(recipe), "--dry-run"]) == 0
    out = capsys.readouterr().out
    loaded = load_recipe(PipelineRecipe, recipe)
    tasks = get_suite(loaded.suite).n_tasks if loaded.tasks == ["all"] else len(loaded.tasks)
    report = dry_run(loaded)
    assert report["suite"] == loaded.suite and len(report["tasks"]) == tasks
    assert report["policy_parameters"] == parameter_counts(preset(loaded.sft.policy.preset))["total"]
    assert report["action_tokenizer_parameters"] > 0 and report["world_model_parameters"] > 0
    assert (f"{recipe}: valid. {loaded.suite}, {tasks} task(s); policy {report['policy_parameters'] / 1e6:.1f} M"
            in out)
    for item in report["inputs"]:
        assert (f"MISSING {item['name']}: " in out) == (not item["exists"]), item["name"]
    if loaded.ablation:  # a recipe the ablation also reads: its section checks too
        assert cli(["ablate", str(recipe), "--dry-run"]) == 0
        assert f"{recipe}: valid. {len(loaded.ablation['arms'])} arm(s)" in capsys.readouterr().out


def test_suite_recipes_cover_every_suite_with_the_product_setting():
    import yaml

    names = {r.stem for r in PIPELINE_RECIPES}
    assert {"libero_90", "libero_10", "libero_spatial", "libero_object", "libero_goal", "libero_10_paper",
            "demo", "gym_fetch_pick_place"} <= names
    for suite in ("libero_90", "libero_10", "libero_spatial", "libero_object", "libero_goal"):
        recipe = yaml.safe_load(Path(f"recipes/{suite}.yaml").read_text())
        g = recipe["grpo"]["grpo"]
        assert (g["rollouts_per_task"], g["steps"], g["max_real_steps"]) == (64, 40, 520)
        assert recipe["sft"]["policy"]["preset"] == "minivla-1b" and recipe["eval"]["trials"] == 50


@pytest.mark.parametrize("suite", ["libero_90", "libero_10", "libero_spatial", "libero_object", "libero_goal"])
def test_the_gated_overrides_a_suite_recipe_quotes_give_the_recommended_gate(suite, capsys):
    from minivla_wmrl.infra.config import load_recipe
    from minivla_wmrl.pipeline import PipelineRecipe

    lines = Path(f"recipes/{suite}.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().endswith("Add to the command line:")) + 1
    quoted = []
    for line in lines[start:]:
        if not line.strip().startswith("#   grpo."):
            break
        quoted += line.strip().lstrip("#").split()
    assert cli(["run", "--dry-run", f"recipes/{suite}.yaml", *quoted]) == 0
    assert "valid." in capsys.readouterr().out
    grpo = load_recipe(PipelineRecipe, Path(f"recipes/{suite}.yaml"), quoted).grpo
    assert (grpo.grpo.execution, grpo.grpo.reward_mode, grpo.grpo.anchor_fraction) == ("gated", "sparse", 0.25)
    assert (grpo.gate.predictor, grpo.gate.cut_reward, grpo.gate.warm_start) == ("proprio", "failure", True)


def test_missing_user_inputs_say_what_is_needed_and_where(tmp_path, capsys):
    assert cli(["run", "recipes/libero_10.yaml", f"out={tmp_path / 'run'}", "--stage", "sft"]) == 1
    err = capsys.readouterr().err
    assert "data: data/libero_10" in err and "minivla_run_dir" in err and "huggingface.co/Stanford-ILIAD" in err
    assert not (tmp_path / "run").exists()


def test_gym_recipe_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "gym"
    overrides = [f"out={out}", "demos.num=4", "demos.max_episodes=6", "vq.train.steps=100", "sft.sft.steps=40",
                 "sft.sft.eval_every=40", "sft.sft.save_every=40", "wm.collect.episodes_per_task=2", "wm.train.steps=6",
                 "wm.train.eval_every=6", "wm.train.save_every=6", "grpo.grpo.steps=1", "eval.trials=2",
                 # WMRL beside it: gated execution from the same SFT checkpoint, evaluated and costed beside grpo
                 "wmrl.overrides=[grpo.reward_mode=sparse, grpo.execution=gated, grpo.anchor_fraction=0.5]",
                 "eval.checkpoints=[sft, grpo, wmrl]"]
    assert cli(["run", "recipes/gym_fetch_pick_place.yaml", *overrides]) == 0
    printed = capsys.readouterr().out
    assert "| FetchPickAndPlace-v4 |" in printed and "run directory" in printed
    wmrl = [json.loads(line) for line in (out / "wmrl" / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((out / "wmrl" / "recipe.json").read_text())["grpo"]["execution"] == "gated"
    assert (f"| wmrl | {wmrl[-1]['sim_steps']} |" in printed and "| grpo |" in printed
            and "× fewer than the first" in printed)
    # the gate started from the wm stage's collection: its episodes' steps, and the ratio charged with them
    from minivla_wmrl.data.replay import replay_real_steps

    collected = replay_real_steps([out / "wm" / "replay"])
    grpo_steps = json.loads((out / "grpo" / "metrics.jsonl").read_text().splitlines()[-1])["sim_steps"]
    (row,) = [line for line in printed.splitlines() if line.startswith("| wmrl | ")]
    assert collected > 0 and row.endswith(f"| {collected} | {grpo_steps / (wmrl[-1]['sim_steps'] + collected):.2f}× |")
    gate = json.loads((out / "plots" / "wmrl_gate.png.json").read_text())
    assert gate["anchors"] == wmrl[-1]["gate_anchors"] and gate["active"] == bool(wmrl[-1]["gate_active"])
    report = json.loads((out / "demos" / "demos_report.json").read_text())
    assert report[0]["succeeded"] == 4
    for name in ("sft", "grpo", "wmrl"):
        (path,) = (out / "eval" / name).glob("*/eval_info.json")  # eval/sft/final, eval/grpo/step_0000001
        info = json.loads(path.read_text())
        assert info["overall"]["trials"] == 2 and info["settings"]["suite"] == "gym"
    grpo = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert grpo[0]["real_episodes"] == 6 and grpo[0]["rollouts"] == 6
    curves = json.loads((out / "plots" / "training_curves.png.json").read_text())  # the points drawn
    assert curves["grpo: success_rate"] == [[1, grpo[0]["success_rate"]]]
    sft = [json.loads(line) for line in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert curves["sft: loss"] == [[r["step"], r["loss"]] for r in sft if "loss" in r]
    calibration = json.loads((out / "plots" / "wm_calibration.png.json").read_text())
    assert calibration["anchors"] == grpo[0]["real_labels_used"] > 0  # every anchor's (score, outcome) pair
    assert len(calibration["raw world-model score"]) >= 1
    assert imageio.imread(out / "plots" / "training_curves.png").shape[2] in (3, 4)
    assert set(json.loads((out / "stage_times.json").read_text())) == {"demos", "vq", "sft", "wm", "grpo", "wmrl",
                                                                        "eval"}


@pytest.mark.parametrize("override, key", [
    ("grpo.policy.checkpoint=runs/elsewhere/final", "grpo.policy.checkpoint"),
    ("sft.out=runs/my_sft", "sft.out"),
    ("wm.collect.tasks=['3']", "wm.collect.tasks"),
])
def test_a_stage_input_the_pipeline_connects_is_not_silently_replaced(tmp_path, capsys, override, key):
    assert cli(["run", "recipes/demo.yaml", f"out={tmp_path / 'run'}", override, "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert f"sets {key} = " in err and "remove" in err
    assert not (tmp_path / "run").exists()


def test_values_equal_to_the_connected_ones_are_accepted(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(["run", "recipes/demo.yaml", f"out={out}", f"grpo.policy.checkpoint={out / 'sft' / 'final'}",
                "--dry-run"]) == 0


@pytest.mark.parametrize("overrides, expected", [  # the demo's recipe runs and evaluates a gated wmrl stage
    (["wmrl.overrides=[]"], "set both or neither"),  # evaluated, but never run
    (["eval.checkpoints=[sft, grpo]"], "set both or neither"),  # runs, but never evaluated
    (["wmrl.overrides=[policy.checkpoint=elsewhere]"],
     r"wmrl.overrides overrides \['policy.checkpoint'\]: the pipeline sets"),
    (["wmrl.overrides=[grpo.execution=gated]"], "grpo.execution 'gated' needs reward_mode sparse, anchor_fraction < 1"),
    (["wmrl.overrides=[grpo.no_such_key=1]"], "no_such_key"),
])
def test_a_wmrl_stage_that_cannot_run_as_asked_is_refused_before_any_work(tmp_path, capsys, overrides, expected):
    assert cli(["run", "recipes/demo.yaml", f"out={tmp_path / 'run'}", *overrides, "--dry-run"]) == 1
    assert re.search(expected, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()
