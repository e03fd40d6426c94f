"""`minivla-wmrl ablate`: arms × seeds from one SFT checkpoint, paired held-out evaluation, resume.

Runs on PointReach (inline envs, a few seconds per cell); the GRPO and evaluation it composes are
tested on the real LIBERO simulator in their own files."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from envs.point_reach import ENV_ID
from minivla_wmrl.cli import main as cli
from tests.test_learning import EPISODE_STEPS, IMAGE, INSTRUCTION, goal_for, weak_policy
from world_models.progress_model import ProgressModelConfig, ProgressWorldModel


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory):
    """A finished pipeline up to the world model (the ablation keeps finished stages) and its recipe."""
    root = tmp_path_factory.mktemp("ablation")
    out = root / "run"
    policy = weak_policy()
    goal = goal_for(policy)
    policy.save_pretrained(out / "sft" / "final")
    (out / "vq" / "action_tokenizer").mkdir(parents=True)
    (out / "wm" / "world_model").mkdir(parents=True)
    ProgressWorldModel(ProgressModelConfig(image_size=32, dim=32, layers=1, dropout=0.0)).save_pretrained(
        out / "wm" / "world_model")
    recipe = {
        "out": str(out), "suite": "gym", "tasks": [ENV_ID], "data": [str(root)],
        "gym": {"instruction": INSTRUCTION, "resolution": IMAGE,
                "make_kwargs": {"goal": goal, "speed": 1 / EPISODE_STEPS}},
        "grpo": {"policy": {"lora": False}, "env": {"envs_per_task": 4, "backend": "inline", "train_init_states": 8},
                 "grpo": {"steps": 2, "rollouts_per_task": 8, "init_states_per_step": 2,
                          "max_real_steps": EPISODE_STEPS, "reward_mode": "sparse", "lr": 6e-3,
                          "queries_per_rollout": 2, "minibatch_size": 8,
                          "wm_cotrain": False, "save_every": 1}},
        "eval": {"trials": 4, "samples_per_state": 2, "temperature": 1.0, "execute_steps": 8,
                 "max_steps": EPISODE_STEPS, "envs": 4, "backend": "inline", "videos": "none"},
        "ablation": {"seeds": [0, 1], "eval_every": 1,
                     "arms": [{"name": "sparse", "overrides": []},
                              {"name": "lr0", "overrides": ["grpo.lr=0"], "seeds": [0]}]},
    }
    path = root / "ablation.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path, out


def test_ablation_pairs_arms_on_held_out_states_and_resumes(recipe_path, capsys):
    path, out = recipe_path
    assert cli(["ablate", str(path)]) == 0
    assert "| sparse |" in capsys.readouterr().out
    report = json.loads((out / "ablation" / "ablation.json").read_text())
    sparse, lr0 = report["arms"]
    assert report["sft"]["trials"] == 8  # 4 init states × 2 samples
    assert sparse["grpo_seeds"] == [0, 1] and lr0["grpo_seeds"] == [1000]  # arms never share rollouts
    assert report["seeding"].startswith("independent")
    # lr 0: the policy does not move, so every held-out episode repeats the SFT checkpoint's
    assert lr0["episodes"] == 8 and lr0["identical_to_sft"] == 8 and lr0["vs_sft"]["difference"] == 0
    assert [seed["episodes"] for seed in lr0["vs_first_arm"]["per_seed"]] == [8]  # on the seed both arms ran
    assert "vs_first_arm" not in sparse and lr0["vs_first_arm"]["ci95"] is None  # one seed: no seed-level interval
    # the training seed is the unit: per-seed McNemar, an interval over seeds, and the unit said in the output
    assert [seed["episodes"] for seed in sparse["vs_sft"]["per_seed"]] == [8, 8]
    low, high = sparse["vs_sft"]["ci95"]
    assert -1 <= low <= sparse["vs_sft"]["difference"] <= high <= 1
    assert "training seeds" in report["statistics_unit"] and "training seeds" in \
        (out / "ablation" / "ablation.md").read_text()
    for arm in (sparse, lr0):
        assert [p["step"] for p in arm["curve"]] == [1, 2]  # the intermediate checkpoint is evaluated too
        assert arm["curve"][0]["real_steps"] < arm["curve"][1]["real_steps"] == arm["real_steps"]["mean"]
    assert len(sparse["held_out_per_seed"]) == 2 and sparse["held_out"]["ci95"] is not None
    assert len(lr0["held_out_per_seed"]) == 1 and lr0["held_out"]["ci95"] is None  # one seed: no interval
    for arm in (sparse, lr0):
        assert arm["real_steps_per_grpo_step"] == pytest.approx(arm["real_steps"]["mean"] / 2)
        assert arm["cut_share"] == 0  # full execution: nothing cut
    assert sparse["steps_to_first_arm_final"] is not None  # the first arm reaches its own final success
    table = (out / "ablation" / "ablation.md").read_text()
    assert "| lr0 |" in table and "8/8" in table and "Real-simulator cost" in table
    assert sparse["calibration_auroc"] is None and "| sparse | " in table.split("Real-simulator cost")[1]
    budget = report["budget"]  # non-inferiority at 1.5x fewer real steps than the first arm, by default
    assert budget == {"ratio": 1.5, "real_steps": pytest.approx(sparse["real_steps"]["mean"] / 1.5)}
    assert "at_budget" not in sparse and all(s <= budget["real_steps"] for s in lr0["at_budget"]["real_steps"])
    assert "At a fixed real-execution cost" in table
    interpolated = any(arm["steps_interpolated"] for arm in (sparse, lr0))
    assert ("interpolated on a straight line" in table) == interpolated  # every interpolated crossing is flagged
    # the report carries its evidence (every seed's episodes) and recomputes from it alone
    evidence = report["evidence"]
    assert len(evidence["arms"][0]["cells"]) == 2 and len(evidence["sft"]["episodes"]) == 8
    assert all(len(e["episodes"]) == 8 for e in evidence["arms"][0]["cells"][0]["evaluations"])
    assert "torch" in evidence["versions"]["packages"] and (out / "ablation" / "sparse" / "seed0" /
                                                             "versions.json").exists()
    capsys.readouterr()
    assert cli(["ablate", "--from-json", str(out / "ablation" / "ablation.json")]) == 0
    assert capsys.readouterr().out.strip() == table.strip()
    drawn = json.loads((out / "ablation" / "ablation.png.json").read_text())  # the points the plot draws
    assert drawn["sparse"] == [[0.0, report["sft"]["success_rate"]]] + [
        [p["real_steps"], p["success"]["mean"]] for p in sparse["curve"]]

    cells = sorted((out / "ablation").glob("*/seed*/cell.json"))
    assert len(cells) == 3
    stamps = [os.stat(c).st_mtime_ns for c in cells]
    assert cli(["ablate", str(path)]) == 0  # a re-run skips finished cells
    assert [os.stat(c).st_mtime_ns for c in cells] == stamps

    changed = yaml.safe_load(path.read_text())  # ... but not when they ran other settings
    changed["grpo"]["grpo"]["lr"] = 3e-3
    path.with_name("changed.yaml").write_text(yaml.safe_dump(changed))
    capsys.readouterr()
    assert cli(["ablate", str(path.with_name("changed.yaml"))]) == 1
    err = capsys.readouterr().err
    assert "sparse/seed0" in err and "grpo.lr: 0.006 → 0.003" in err
    assert [os.stat(c).st_mtime_ns for c in cells] == stamps


def test_a_further_protocol_evaluates_a_finished_ablation_without_training(recipe_path, capsys):
    path, out = recipe_path
    if not (out / "ablation" / "ablation.json").exists():
        assert cli(["ablate", str(path)]) == 0
    cells = sorted((out / "ablation").glob("*/seed*/cell.json"))
    checkpoints = sorted((out / "ablation").glob("*/seed*/checkpoints/step_*/*.safetensors"))
    stamps = [os.stat(p).st_mtime_ns for p in cells + checkpoints]
    greedy = yaml.safe_load(path.read_text())
    greedy["ablation"]["protocols"] = [{"name": "greedy", "overrides": [
        "eval.temperature=0", "eval.samples_per_state=1", "eval.init_states=validation"]},
        {"name": "greedy_pub", "overrides": ["eval.temperature=0", "eval.samples_per_state=1"]}]
    greedy["ablation"]["guard_protocol"], greedy["ablation"]["guard_p"] = "greedy", 1.0  # any gain is kept
    path.with_name("greedy.yaml").write_text(yaml.safe_dump(greedy))
    capsys.readouterr()
    assert cli(["ablate", str(path.with_name("greedy.yaml"))]) == 0
    assert "eval_greedy/ablation.md" in capsys.readouterr().out
    assert [os.stat(p).st_mtime_ns for p in cells + checkpoints] == stamps  # nothing trained again
    sampled = json.loads((out / "ablation" / "ablation.json").read_text())
    report = json.loads((out / "ablation" / "eval_greedy" / "ablation.json").read_text())
    assert report["eval_settings"]["sampling"] == "greedy" and sampled["eval_settings"]["sampling"] != "greedy"
    assert report["eval_settings"]["init_states"] == "validation"  # a recipe's eval section chooses its states
    assert report["sft"]["trials"] == 4  # 4 init states, one greedy episode each
    sparse, lr0 = report["arms"]
    assert [p["step"] for p in sparse["curve"]] == [1, 2]  # every checkpoint the recipe's protocol evaluated
    assert lr0["identical_to_sft"] == 4  # an unchanged policy repeats SFT's greedy episodes too
    for arm, before in zip(report["arms"], sampled["arms"]):  # the training evidence is the same cells'
        assert arm["real_steps"] == before["real_steps"] and arm["grpo_seeds"] == before["grpo_seeds"]
    for cell in cells:
        for evals in ("eval_greedy", "eval_greedy_pub"):
            assert sorted(p.name for p in (cell.parent / evals).iterdir()) == ["step_0000001", "step_0000002"]
    capsys.readouterr()
    assert cli(["ablate", "--from-json", str(out / "ablation" / "eval_greedy" / "ablation.json")]) == 0
    assert capsys.readouterr().out.strip() == (out / "ablation" / "eval_greedy" / "ablation.md").read_text().strip()

    # the guard after the fact: a seed keeps its final checkpoint where it beat SFT greedily, else SFT's
    sampled = json.loads((out / "ablation" / "ablation.json").read_text())
    assert "guarded" not in report and [row["arm"] for row in sampled["guarded"]] == ["sparse", "lr0"]
    published = json.loads((out / "ablation" / "eval_greedy_pub" / "ablation.json").read_text())
    assert published["guarded"][0]["kept"] == sampled["guarded"][0]["kept"]  # one choice, judged by each protocol
    for row, arm, checked in zip(sampled["guarded"], sampled["arms"], report["arms"]):
        assert row["kept"] == [s > report["sft"]["success_rate"] for s in checked["held_out_per_seed"]]
        assert row["held_out_per_seed"] == [final if keep else sampled["sft"]["success_rate"]
                                            for final, keep in zip(arm["held_out_per_seed"], row["kept"])]
        for keep, seed in zip(row["kept"], row["vs_sft"]["per_seed"]):
            assert keep or seed["gained"] == seed["lost"] == 0  # SFT kept: its own episodes
    assert sampled["guarded"][1]["kept"] == [False]  # lr 0 repeats SFT's episodes: nothing to keep
    assert "| sparse | " in (out / "ablation" / "ablation.md").read_text().split("Guarded")[1]
    both = [str(out / "ablation" / "ablation.json")] * 2
    assert cli(["ablate", "--from-json", *both, "--guarded"]) == 0
    assert "guarded, across 2 tasks" in capsys.readouterr().out
    assert cli(["ablate", "--from-json", both[0]]) == 0  # the main report, guarded rows included, recomputes
    assert capsys.readouterr().out.strip() == (out / "ablation" / "ablation.md").read_text().strip()
    assert cli(["ablate", "--from-json", both[0], "--guarded"]) == 1
    assert "several --from-json" in capsys.readouterr().err
    assert cli(["ablate", "--from-json", *[str(out / "ablation" / "eval_greedy" / "ablation.json")] * 2,
                "--guarded"]) == 1
    assert "no guarded rows" in capsys.readouterr().err

    # an interrupted protocol evaluation is finished on the next run, still without training
    unfinished = sorted((out / "ablation").glob("sparse/seed1/eval_greedy/step_*/eval_info.json"))[-1]
    unfinished.unlink()
    assert cli(["ablate", str(path.with_name("greedy.yaml"))]) == 0
    assert unfinished.exists() and [os.stat(p).st_mtime_ns for p in cells + checkpoints] == stamps
    assert json.loads((out / "ablation" / "eval_greedy" / "ablation.json").read_text())["arms"][0][
        "held_out_per_seed"] == sparse["held_out_per_seed"]

    # the same protocol name with other overrides would mix two protocols' episodes in one report
    greedy["ablation"]["protocols"][0]["overrides"].append("eval.execute_steps=4")
    path.with_name("changed.yaml").write_text(yaml.safe_dump(greedy))
    capsys.readouterr()
    assert cli(["ablate", str(path.with_name("changed.yaml"))]) == 1
    assert "ablation protocol 'greedy' was evaluated with other settings" in capsys.readouterr().err


def test_a_final_only_protocol_plays_the_chosen_arms_final_checkpoints_alone(recipe_path, capsys):
    path, out = recipe_path
    if not (out / "ablation" / "ablation.json").exists():
        assert cli(["ablate", str(path)]) == 0
    more = yaml.safe_load(path.read_text())
    more["ablation"]["protocols"] = [{"name": "x2", "overrides": ["eval.samples_per_state=4"], "final_only": True,
                                      "arms": ["sparse"]}]
    path.with_name("more.yaml").write_text(yaml.safe_dump(more))
    capsys.readouterr()
    assert cli(["ablate", str(path.with_name("more.yaml"))]) == 0
    for seed in (0, 1):  # the sparse cells' final checkpoint (step 2) only; lr0's cell not at all
        assert [p.name for p in (out / "ablation" / "sparse" / f"seed{seed}" / "eval_x2").iterdir()] == ["step_0000002"]
    assert not (out / "ablation" / "lr0" / "seed0" / "eval_x2").exists()
    report = json.loads((out / "ablation" / "eval_x2" / "ablation.json").read_text())
    (sparse,) = report["arms"]
    assert report["sft"]["trials"] == 16 and sparse["episodes"] == 32  # 4 states × 4 samples, per checkpoint
    assert [p["step"] for p in sparse["curve"]] == [2]
    assert sparse["real_step_ratio"] is None and sparse["real_step_ratio_interval"] is None  # one point per seed
    assert "final checkpoints only" in (out / "ablation" / "eval_x2" / "ablation.md").read_text()
    sampled = json.loads((out / "ablation" / "ablation.json").read_text())  # the first 2 samples: the same episodes
    assert {tuple(row) for row in sampled["evidence"]["sft"]["episodes"]} <= {
        tuple(row) for row in report["evidence"]["sft"]["episodes"]}
    capsys.readouterr()
    assert cli(["ablate", "--from-json", str(out / "ablation" / "eval_x2" / "ablation.json")]) == 0
    assert capsys.readouterr().out.strip() == (out / "ablation" / "eval_x2" / "ablation.md").read_text().strip()
    for arms, expected in ((["lr0"], "the first ('sparse'"), (["sparse", "dense"], "unknown: ['dense']")):
        more["ablation"]["protocols"][0]["arms"] = arms
        path.with_name("more.yaml").write_text(yaml.safe_dump(more))
        assert cli(["ablate", str(path.with_name("more.yaml"))]) == 1
        assert expected in capsys.readouterr().err


def rows(successes: int, states: int = 20) -> list[list]:
    """Episode rows [task, trial, sample, success]: the first `successes` of `states` init states succeed."""
    return [[0, trial, 0, int(trial < successes)] for trial in range(states)]


def test_the_guard_keeps_a_final_checkpoint_only_past_its_significance_level():
    from minivla_wmrl.ablation import guarded_arms

    sft_held_out = {((0, t), 0): t < 5 for t in range(20)}
    finals = {"sparse": [{((0, t), 0): t < 12 for t in range(20)}, {((0, t), 0): t < 6 for t in range(20)}]}
    # on the guard's episodes seed 0 gains 9 of 20 states (McNemar p = 0.004), seed 1 gains 2 (p = 0.5)
    guard = {"sft": rows(4), "arms": {"sparse": [rows(13), rows(6)]}, "seeds": {"sparse": [0, 1]}}
    strict, loose = (guarded_arms(guard | {"accept_p": p}, sft_held_out, finals, {"sparse": [0, 1]})[0]
                     for p in (0.05, 1.0))
    assert strict["kept"] == [True, False] and loose["kept"] == [True, True]
    assert strict["held_out_per_seed"] == [0.6, 0.25]  # seed 1 falls back to SFT's held-out episodes
    assert loose["held_out_per_seed"] == [0.6, 0.3]
    with pytest.raises(ValueError, match="must be the same cells"):
        guarded_arms(guard | {"accept_p": 0.05}, sft_held_out, finals, {"sparse": [0, 2]})


def test_the_fixed_cost_comparison_takes_each_seeds_last_checkpoint_within_the_budget():
    from minivla_wmrl.ablation import within_budget

    def by_state(successes):
        return {((0, trial), 0): trial < successes for trial in range(10)}

    cells = [{"evaluations": [{"step": 5, "real_steps": 100.0, "episodes": rows(4, 10)},
                              {"step": 10, "real_steps": 200.0, "episodes": rows(9, 10)}]},  # past the budget
             {"evaluations": [{"step": 5, "real_steps": 120.0, "episodes": rows(6, 10)},
                              {"step": 10, "real_steps": 150.0, "episodes": rows(7, 10)}]},
             {"evaluations": [{"step": 5, "real_steps": 180.0, "episodes": rows(9, 10)}]}]  # none within: SFT's
    result = within_budget(cells, 160.0, by_state(2), [by_state(5)] * 3)
    assert result["steps"] == [5, 10, 0] and result["real_steps"] == [100.0, 150.0, 0]
    assert result["held_out_per_seed"] == [0.4, 0.7, 0.2]  # the 90% checkpoints cost more than the budget
    assert result["vs_first_arm"]["difference"] == pytest.approx((0.4 + 0.7 + 0.2) / 3 - 0.5)
    assert [s["episodes"] for s in result["vs_first_arm"]["per_seed"]] == [10, 10, 10]
    charged = within_budget(cells, 160.0, by_state(2), [by_state(5)] * 3, charges=[0.0, 20.0, 0.0])
    assert charged["steps"] == [5, 5, 0] and charged["held_out_per_seed"] == [0.4, 0.6, 0.2]  # 150 + 20 > 160


def test_bad_arm_overrides_are_refused_before_any_work(recipe_path, capsys):
    path, out = recipe_path
    bad = yaml.safe_load(path.read_text())
    bad["out"] = str(out.parent / "bad")
    bad["ablation"]["arms"] = [{"name": "x", "overrides": ["grpo.learning_rate=1"]}]
    path.with_name("bad.yaml").write_text(yaml.safe_dump(bad))
    assert cli(["ablate", str(path.with_name("bad.yaml"))]) == 1
    assert "learning_rate" in capsys.readouterr().err
    assert not (out.parent / "bad" / "ablation").exists()
    for protocols, expected in [([{"name": "p", "overrides": ["grpo.lr=0"]}], "training settings belong to an arm"),
                                ([{"name": "p", "overrides": ["eval.temprature=0"]}], "temprature"),
                                ([{"name": "a b", "overrides": []}], "protocol names"),
                                ([], "guard_protocol"),
                                ([{"name": "g", "overrides": ["eval.temperature=0"]}], "greedy samples"),
                                ([{"name": "p", "overrides": ["eval.image_convention=openvla"]}],
                                 "ablation protocol 'p': the pipeline recipe sets eval.image_convention"),
                                ([{"name": "g", "overrides": ["eval.temperature=0", "eval.samples_per_state=1"]}],
                                 "flatters it")]:
        bad["ablation"]["guard_protocol"] = "g" if protocols and protocols[0]["name"] == "g" else (
            "" if protocols else "greedy")
        bad["ablation"]["arms"] = [{"name": "sparse", "overrides": []}]
        bad["ablation"]["protocols"] = protocols
        path.with_name("bad.yaml").write_text(yaml.safe_dump(bad))
        assert cli(["ablate", str(path.with_name("bad.yaml"))]) == 1
        assert expected in capsys.readouterr().err
        assert not (out.parent / "bad" / "ablation").exists()
    bad["ablation"]["protocols"], bad["ablation"]["guard_protocol"] = [], ""
    bad["ablation"]["arms"] = [{"name": "eval_greedy", "overrides": []}]  # where a protocol's evaluations go
    path.with_name("bad.yaml").write_text(yaml.safe_dump(bad))
    assert cli(["ablate", str(path.with_name("bad.yaml"))]) == 1
    assert "other than 'eval'" in capsys.readouterr().err


def test_steps_to_reach_interpolates_along_the_mean_curve():
    from minivla_wmrl.ablation import steps_to_reach

    curve = [{"real_steps": 100.0, "success": {"mean": 0.3}}, {"real_steps": 300.0, "success": {"mean": 0.5}}]
    assert steps_to_reach(curve, 0.2, 0.4) == (pytest.approx(200.0), True)  # halfway between 0.3 at 100 and 0.5 at 300
    assert steps_to_reach(curve, 0.2, 0.25) == (pytest.approx(50.0), True)  # between SFT (0 steps) and the first point
    assert steps_to_reach(curve, 0.2, 0.5) == (pytest.approx(300.0), False)  # reached at an evaluated checkpoint
    assert steps_to_reach(curve, 0.45, 0.4) == (0.0, False)  # SFT already there
    assert steps_to_reach(curve, 0.2, 0.6) == (None, False)


def test_the_real_step_ratio_interval_resamples_seeds():
    from minivla_wmrl.ablation import real_step_ratio_interval

    first = [[(100.0, 0.3), (200.0, 0.5)], [(100.0, 0.4), (200.0, 0.5)], [(100.0, 0.2), (200.0, 0.4)]]
    faster = [[(50.0, 0.5), (100.0, 0.6)]] * 3  # reaches any first-arm target before its first checkpoint
    result = real_step_ratio_interval(first, faster, sft_success=0.1)
    assert result["reached_share"] == 1.0 and 1 < result["ci95"][0] <= result["ci95"][1]
    never = [[(50.0, 0.1), (100.0, 0.1)]] * 3
    assert real_step_ratio_interval(first, never, sft_success=0.1) == {"ci95": None, "reached_share": 0.0}
    too_few = real_step_ratio_interval(first, faster, sft_success=0.1, resamples=20)  # < 40 ratios: no 95% interval
    assert too_few == {"ci95": None, "reached_share": 1.0}
    assert real_step_ratio_interval(first[:1], faster, sft_success=0.1) is None  # one seed: no interval
    assert real_step_ratio_interval(first, faster, sft_success=0.1, charges=[0, 0, 0]) == result
    charged = real_step_ratio_interval(first, faster, sft_success=0.1, charges=[1000, 1000, 1000])
    assert charged["reached_share"] == 1.0 and charged["ci95"][1] < 1  # paid 1000 steps before its first step


def test_several_reports_pool_one_arm_over_their_tasks(capsys):
    """`ablate --from-json` given one committed ablation per task: a row per task and their mean."""
    docs = Path(__file__).resolve().parent.parent / "docs"
    files = [str(docs / f) for f in ("ablation_rl_cpu.json", "ablation_rl_cpu_t28.json", "ablation_rl_cpu_t47.json")]
    assert cli(["ablate", "--from-json", *files]) == 0
    table = capsys.readouterr().out
    assert all(f"| {f} | libero_90 [{t}] |" in table for f, t in zip(files, ("0", "28", "47")))
    assert "| mean over the 3 tasks |" in table
    assert cli(["ablate", "--from-json", *files, "--arm", "gated"]) == 1
    assert "has no arm 'gated'" in capsys.readouterr().err
    assert cli(["ablate", "--from-json", *files, "--out", "x"]) == 1
    assert "writes one report" in capsys.readouterr().err


def test_reports_of_one_ablation_from_several_sessions_merge_into_one(tmp_path, capsys):
    """`ablate --from-json A B --merge`: cells run in separate invocations pool by seed; a cell both ran
    must have repeated exactly; other SFT checkpoints or settings are refused."""
    import copy

    docs = Path(__file__).resolve().parent.parent / "docs"
    whole = json.loads((docs / "ablation_rl_cpu_t28_shuffled.json").read_text())  # sparse 0-4, shuffled 0-2

    def part(seeds: dict, name: str) -> Path:
        evidence = copy.deepcopy(whole["evidence"])
        evidence["arms"] = [dict(a, cells=[c for c in a["cells"] if c["seed"] in seeds[a["arm"]]])
                            for a in evidence["arms"] if a["arm"] in seeds]
        evidence["guard"]["arms"] = {a: [e for s, e in zip(evidence["guard"]["seeds"][a], evidence["guard"]["arms"][a])
                                         if s in seeds[a]] for a in seeds}
        evidence["guard"]["seeds"] = {a: [s for s in evidence["guard"]["seeds"][a] if s in seeds[a]] for a in seeds}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"evidence": evidence}))
        return path

    a = part({"sparse": [0, 1, 2], "shuffled": [0]}, "a")
    b = part({"sparse": [2, 3, 4], "shuffled": [1, 2]}, "b")  # sparse seed 2 in both: the same cell
    slower = json.loads(b.read_text())  # ... run again on a busier machine: its episodes repeat, not its timings
    slower["evidence"]["arms"][0]["cells"][0]["evaluations"][-1]["success"]["eval_s"] *= 9
    b.write_text(json.dumps(slower))
    assert cli(["ablate", "--from-json", str(a), str(b), "--merge", "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "ablation.json").read_text())
    for arm, expected in zip(merged["arms"], whole["arms"]):
        assert arm["seeds"] == expected["seeds"] and arm["vs_sft"] == expected["vs_sft"]
        assert arm["held_out_per_seed"] == expected["held_out_per_seed"]
    assert merged["guarded"] == whole["guarded"]
    assert [m["seeds"] for m in merged["evidence"]["merged_from"]] == [{"sparse": [0, 1, 2], "shuffled": [0]},
                                                                       {"sparse": [2, 3, 4], "shuffled": [1, 2]}]
    capsys.readouterr()

    # a (like the committed report) predates GRPOConfig's `oracle_cut_steps`: it ran at the default, 0
    assert "oracle_cut_steps" not in json.loads(a.read_text())["evidence"]["grpo"]
    cut = json.loads(b.read_text())
    cut["evidence"]["grpo"]["oracle_cut_steps"] = 0
    b.write_text(json.dumps(cut))
    assert cli(["ablate", "--from-json", str(a), str(b), "--merge", "--out", str(tmp_path / "newer")]) == 0
    assert json.loads((tmp_path / "newer" / "ablation.json").read_text())["arms"] == merged["arms"]
    capsys.readouterr()
    cut["evidence"]["grpo"]["oracle_cut_steps"] = 40  # the field at its default in one, set in the other: another run
    b.write_text(json.dumps(cut))
    assert cli(["ablate", "--from-json", str(a), str(b), "--merge"]) == 1
    assert "differ in grpo settings" in capsys.readouterr().err
    cut["evidence"]["grpo"]["oracle_cut_steps"] = 0

    flipped = cut  # sparse seed 2 did not repeat: one episode differs
    flipped["evidence"]["arms"][0]["cells"][0]["evaluations"][-1]["episodes"][0][3] ^= 1
    b.write_text(json.dumps(flipped))
    assert cli(["ablate", "--from-json", str(a), str(b), "--merge"]) == 1
    assert "arm 'sparse' seed 2" in capsys.readouterr().err
    other = json.loads(a.read_text())
    other["evidence"]["eval_settings"]["checkpoint_sha256"] = "0" * 64  # another SFT checkpoint
    a.write_text(json.dumps(other))
    assert cli(["ablate", "--from-json", str(a), str(b), "--merge"]) == 1
    assert "differ in eval_settings" in capsys.readouterr().err
    other["evidence"]["eval_settings"] = whole["evidence"]["eval_settings"]
    a.write_text(json.dumps(other))
    finals = json.loads(b.read_text())
    finals["evidence"]["final_only"] = True  # every evaluated checkpoint in one report, the finals alone in the other
    b.write_text(json.dumps(finals))
    assert cli(["ablate", "--from-json", str(a), str(b), "--merge"]) == 1
    assert "differ in checkpoints played (final_only)" in capsys.readouterr().err
    assert cli(["ablate", "--from-json", str(a), "--merge"]) == 1
    assert "several --from-json reports" in capsys.readouterr().err


def test_against_compares_every_arm_with_the_named_one(tmp_path, capsys):
    """`ablate --from-json R --against ARM`: ARM becomes the reference of every difference and ratio (the
    gate against its time-only twin); the arms' own figures do not move."""
    report = Path(__file__).resolve().parent.parent / "docs" / "ablation_rl_cpu_t28_cap400_fresh.json"
    plain = {a["arm"]: a for a in json.loads(report.read_text())["arms"]}
    assert cli(["ablate", "--from-json", str(report), "--against", "time400_collect", "--out", str(tmp_path)]) == 0
    recomputed = json.loads((tmp_path / "ablation.json").read_text())
    arms = {a["arm"]: a for a in recomputed["arms"]}
    assert recomputed["first_arm"] == recomputed["arms"][0]["arm"] == "time400_collect"
    for name, arm in arms.items():
        assert arm["held_out_per_seed"] == plain[name]["held_out_per_seed"] and arm["vs_sft"] == plain[name]["vs_sft"]
    time_, gated = arms["time400_collect"], arms["gated400_collect"]
    shared = len(time_["held_out_per_seed"])
    assert gated["vs_first_arm"]["seeds"] == shared
    assert gated["vs_first_arm"]["difference"] == pytest.approx(
        np.mean(gated["held_out_per_seed"][:shared]) - np.mean(time_["held_out_per_seed"]))
    assert gated["vs_first_arm"] != plain["gated400_collect"]["vs_first_arm"]
    # what settling it would take: the fewest seeds a side whose projected interval is within ±5 points
    se, n = gated["vs_first_arm"]["se"], gated["seeds_to_settle"]

    def half_width(seeds):
        return stats.t.ppf(0.975, seeds - 1) * se * np.sqrt(shared / seeds)
    assert half_width(shared) > 0.05 and half_width(n) <= 0.05 < half_width(n - 1)
    assert f"- gated400_collect: {n} ({shared} run)" in (tmp_path / "ablation.md").read_text()
    # both gates paid for the same collection: charged on both sides, against itself the reference is at 1
    assert time_["charged_ratio"]["real_step_ratio"] == pytest.approx(1.0)
    assert gated["charged_ratio"]["real_step_ratio"] == pytest.approx(
        (time_["steps_to_first_arm_final"] + 15772) / (gated["steps_to_first_arm_final"] + 15772))
    assert "s + 1000 × i (i: the arm's place in the ablation: sparse400, gated400_collect" in recomputed["seeding"]
    capsys.readouterr()
    assert cli(["ablate", "--from-json", str(report), "--against", "truncated"]) == 1
    assert f"no such arm; its arms are {list(plain)}" in capsys.readouterr().err
    assert cli(["ablate", "--from-json", str(report), str(report), "--against", "sparse400"]) == 1
    assert "--against recomputes one" in capsys.readouterr().err


def test_a_gated_cell_is_charged_the_real_steps_of_the_episodes_its_gate_started_from(tmp_path):
    import h5py

    from minivla_wmrl.pipeline import gate_replay_real_steps
    from minivla_wmrl.data.replay import write_replay
    from tests.test_outcome_probe import rollouts

    collected = rollouts(3, 12)
    write_replay(tmp_path / "wm" / "replay" / "collect.hdf5", collected, "collect")
    cell = tmp_path / "cell"
    cell.mkdir()
    for execution, replay, charged in [("gated", [str(tmp_path / "wm" / "replay")], sum(t.length for t in collected)),
                                       ("gated", [], 0), ("full", [str(tmp_path / "wm" / "replay")], 0)]:
        (cell / "recipe.json").write_text(json.dumps({"grpo": {"execution": execution}, "gate": {"replay": replay}}))
        assert gate_replay_real_steps(cell) == charged
    (cell / "recipe.json").write_text(json.dumps({"grpo": {"execution": "full"}}))  # recorded before the gate existed
    assert gate_replay_real_steps(cell) == 0
    h5py.File(tmp_path / "other.hdf5", "w").close()
    (cell / "recipe.json").write_text(json.dumps({"grpo": {"execution": "gated"},
                                                  "gate": {"replay": [str(tmp_path / "other.hdf5")]}}))
    with pytest.raises(ValueError, match="other.hdf5 has no 'episodes' group"):
        gate_replay_real_steps(cell)


def test_a_first_arm_final_at_or_below_sft_leaves_no_ratio_even_charged():
    """Where the first arm ends no higher than SFT, every arm 'reaches' it at 0 steps: no ratio, charged or not, for
    an arm with nothing charged (it was a division by zero `--against` a weak gated arm, whose replay is charged)."""
    from minivla_wmrl.ablation import evidence_from_json, summarize_ablation

    evidence = evidence_from_json(Path(__file__).resolve().parent.parent / "docs" / "ablation_rl_cpu_t28_cap400.json")
    for cell in evidence["arms"][0]["cells"]:
        cell["replay_real_steps"] = 5000
        final = cell["evaluations"][-1]
        final["episodes"] = [row[:-1] + [0] for row in final["episodes"]]
        final["success"]["success_rate"] = 0.0
    for cell in next(a for a in evidence["arms"] if a["arm"] == "gated400_zero_long")["cells"]:
        cell["replay_real_steps"] = 10000
    arms = {a["arm"]: a for a in summarize_ablation(evidence)["arms"]}
    assert arms["gated400"]["steps_to_first_arm_final"] == 0.0 and arms["gated400"]["real_step_ratio"] is None
    assert arms["gated400"]["charged_ratio"]["real_step_ratio"] is None
    charged = arms["gated400_zero_long"]["charged_ratio"]
    assert charged["steps_to_first_arm_final"] == 10000 and charged["real_step_ratio"] == pytest.approx(0.5)


def test_the_charged_ratio_adds_the_replays_cost_to_the_arms_curve():
    """On the committed cap-400 evidence: charging the gated arm's seeds a planted replay cost moves its steps to
    sparse's final by exactly that cost, lowers the ratio and its interval; uncharged figures are unchanged."""
    from minivla_wmrl.ablation import ablation_table, evidence_from_json, summarize_ablation

    evidence = evidence_from_json(Path(__file__).resolve().parent.parent / "docs" / "ablation_rl_cpu_t28_cap400.json")
    plain = {a["arm"]: a for a in summarize_ablation(evidence)["arms"]}
    assert all("charged_ratio" not in a for a in plain.values())  # nothing recorded: nothing charged
    arm = next(a for a in evidence["arms"] if a["arm"] == "gated400_zero_long")
    for cell in arm["cells"]:
        cell["replay_real_steps"] = 10000
    report = summarize_ablation(evidence)
    charged = next(a for a in report["arms"] if a["arm"] == "gated400_zero_long")
    before = plain["gated400_zero_long"]
    assert charged["real_step_ratio"] == before["real_step_ratio"]
    assert charged["real_step_ratio_interval"] == before["real_step_ratio_interval"]
    c = charged["charged_ratio"]
    assert c["steps_to_first_arm_final"] == pytest.approx(before["steps_to_first_arm_final"] + 10000)
    assert c["real_step_ratio"] < before["real_step_ratio"]
    assert c["interval"]["ci95"][1] < before["real_step_ratio_interval"]["ci95"][1]
    assert ("- gated400_zero_long: 10000 real steps per seed before its first GRPO step; sparse400's final reached "
            f"at {c['steps_to_first_arm_final']:.0f}: {c['real_step_ratio']:.2f}x") in ablation_table(report)
    assert "at_budget_charged" not in before and before["at_budget"] == charged["at_budget"]
    budget, within = report["budget"]["real_steps"], charged["at_budget_charged"]
    assert all(s + 10000 <= budget for s in within["real_steps"] if s)  # the replay is spent from the budget
    assert sum(within["steps"]) < sum(charged["at_budget"]["steps"])  # so some seeds stop at an earlier checkpoint
    assert f"| gated400_zero_long, replays charged | {', '.join(str(s) for s in within['steps'])} |" in \
        ablation_table(report)
