"""`minivla-wmrl eval` on the real simulator with a tiny policy; resume; the init-state split; bad input."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import imageio.v2 as imageio
import numpy as np
import pytest

from minivla_wmrl.evaluation.evaluate import EvalConfig, SettingsChanged, evaluate, read_episodes
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer, ActionTokenizerConfig
from minivla_wmrl.rl.init_states import check_disjoint, select_rl_init_states, training_init_states
from tests.tiny_policy import make_policy

MAX_STEPS = 16  # two 8-action queries per episode


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    make_policy(seed=7).save_pretrained(directory := tmp_path_factory.mktemp("ckpt") / "policy")
    return directory


def config(checkpoint, out, **overrides) -> EvalConfig:
    settings = dict(checkpoint=str(checkpoint), suite="libero_90", out=str(out), tasks=["0", "46"], trials=2, envs=2,
                    execute_steps=8, max_steps=MAX_STEPS)
    return EvalConfig(**{**settings, **overrides})


@pytest.mark.simulator
def test_two_tasks_two_trials_write_results_and_videos(checkpoint, tmp_path):
    info = evaluate(config(checkpoint, tmp_path), progress=False)
    assert [t["task"] for t in info["per_task"]] == [0, 46]
    assert info["overall"]["trials"] == 4 and info["complete"]
    on_disk = json.loads((tmp_path / "eval_info.json").read_text())
    assert on_disk["overall"] == info["overall"] and on_disk["per_suite"]["libero_90"]["trials"] == 4
    s = on_disk["settings"]
    assert ((s["sampling"], s["execute_steps"], s["max_steps"], s["protocol_max_steps"])
            == ("greedy", 8, MAX_STEPS, False))
    assert (s["image_convention"], s["resolution"], s["seed"], s["device"]) == ("minivla", 224, 0, "cpu")
    assert len(s["checkpoint_sha256"]) == 64 and s["renderer"]["MUJOCO_GL"] == "egl"
    assert s["center_crop"] is False  # the policy's input crop (Prismatic runs trained with image_aug)
    for task in on_disk["per_task"]:
        assert [e["trial"] for e in task["episodes"]] == [0, 1]
        assert task["successes"] == sum(e["success"] for e in task["episodes"])
        for episode in task["episodes"]:
            assert episode["length"] == MAX_STEPS and episode["failure"] is None
            frames = imageio.mimread(tmp_path / episode["video"])
            assert len(frames) == 3  # two queries and the final frame
            assert frames[0].shape == (224 + 18, 224, 3)
    table = (tmp_path / "eval_table.md").read_text()
    assert "| 46 |" in table and "/2 = " in table and "% [" in table
    # an evaluation written before center_crop was recorded ran without it: it still resumes, runs nothing
    recorded = json.loads((tmp_path / "eval_settings.json").read_text())
    del recorded["center_crop"]
    (tmp_path / "eval_settings.json").write_text(json.dumps(recorded))
    again = evaluate(config(checkpoint, tmp_path), progress=False)["overall"]
    timing = ("eval_s", "eval_ep_s")  # wall time of all invocations: the resumed one adds its own
    assert {k: v for k, v in again.items() if k not in timing} == {k: v for k, v in info["overall"].items()
                                                                    if k not in timing}
    assert again["eval_s"] > info["overall"]["eval_s"] > 0
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 4
    # the same task's two envs in one worker (one GL context) give the same episodes, frame for frame
    shared = evaluate(config(checkpoint, tmp_path / "shared", tasks=["0"], envs_per_worker=2), progress=False)
    assert len(shared["per_task"][0]["episodes"]) == len(info["per_task"][0]["episodes"]) == 2
    for alone, together in zip(info["per_task"][0]["episodes"], shared["per_task"][0]["episodes"]):
        assert (alone["trial"], alone["success"], alone["length"]) == (together["trial"], together["success"],
                                                                       together["length"])
        videos = [imageio.mimread(d / e["video"]) for d, e in ((tmp_path, alone), (tmp_path / "shared", together))]
        assert len(videos[0]) == len(videos[1]) == 3
        for a, b in zip(*videos):
            np.testing.assert_array_equal(a, b)


@pytest.mark.simulator
def test_killed_evaluation_resumes_and_counts_each_trial_once(checkpoint, tmp_path):
    command = [sys.executable, "-m", "minivla_wmrl.cli", "eval", "--checkpoint", str(checkpoint), "--suite",
               "libero_90", "--tasks", "0", "--trials", "3", "--envs", "1", "--execute-steps", "8",
               "--max-steps", str(MAX_STEPS), "--out", str(tmp_path), "--videos", "none"]
    episodes = tmp_path / "episodes.jsonl"
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (episodes.exists() and episodes.read_text().count("\n") >= 1):
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    first = episodes.read_text().splitlines()
    assert 1 <= len(first) < 3, "the evaluation must be killed part-way for this test to mean anything"
    assert not (tmp_path / "eval_info.json").exists()
    subprocess.run(command, check=True, capture_output=True)
    lines = episodes.read_text().splitlines()
    assert lines[:len(first)] == first  # finished trials were not re-run
    assert sorted(json.loads(line)["trial"] for line in lines) == [0, 1, 2]
    info = json.loads((tmp_path / "eval_info.json").read_text())
    assert info["overall"]["trials"] == 3 and info["complete"]
    assert len(read_episodes(episodes)) == 3


@pytest.mark.simulator
def test_resume_with_other_settings_is_refused(checkpoint, tmp_path, monkeypatch):
    first = evaluate(config(checkpoint, tmp_path, tasks=["0"], trials=1, envs=1, videos="none"), progress=False)
    with pytest.raises(SettingsChanged, match="other settings.*execute_steps"):
        evaluate(config(checkpoint, tmp_path, tasks=["0"], trials=1, envs=1, videos="none", execute_steps=4),
                 progress=False)
    # the same checkpoint named by a Hub repo id (its snapshot: here, the same directory) is the same evaluation
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **options: str(checkpoint))
    again = evaluate(config("someone/tiny-minivla", tmp_path, tasks=["0"], trials=1, envs=1, videos="none"),
                     progress=False)
    assert again["settings"]["checkpoint"] == first["settings"]["checkpoint"] == str(checkpoint.resolve())
    assert again["per_task"] == first["per_task"]


def test_bad_checkpoints_and_tasks_are_clear_errors(checkpoint, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="lacks model.safetensors"):
        evaluate(config(broken, tmp_path / "a"), progress=False)
    mismatched = tmp_path / "mismatched"
    shutil.copytree(checkpoint, mismatched)
    shutil.rmtree(mismatched / "action_tokenizer")
    ActionTokenizer(ActionTokenizerConfig(num_codebooks=5)).save_pretrained(mismatched / "action_tokenizer")
    with pytest.raises(ValueError, match="5 codebooks"):
        evaluate(config(mismatched, tmp_path / "b"), progress=False)
    with pytest.raises(ValueError, match="unknown LIBERO suite 'libero_100'"):
        evaluate(config(checkpoint, tmp_path / "c", suite="libero_100"), progress=False)
    with pytest.raises(ValueError, match="task index 90 out of range"):
        evaluate(config(checkpoint, tmp_path / "d", tasks=["90"]), progress=False)
    with pytest.raises(ValueError, match="has 50 evaluation init states"):
        evaluate(config(checkpoint, tmp_path / "e", trials=51), progress=False)
    # once silently wrong: -1 reported 0% with every episode an exception, 0 became the env's 400
    for d, bad in (("f", {"max_steps": -1}), ("g", {"max_steps": 0}), ("h", {"execute_steps": 0}),
                   ("i", {"envs": 0}), ("j", {"temperature": -1.0})):
        with pytest.raises(ValueError, match=f"eval settings.{next(iter(bad))}: .* is out of range"):
            evaluate(config(checkpoint, tmp_path / d, **bad), progress=False)
    with pytest.raises(ValueError, match="name the same task more than once"):  # was 0/2 from one episode
        evaluate(config(checkpoint, tmp_path / "k", tasks=["0", "0"]), progress=False)
    assert not any((tmp_path / d).exists() for d in "abcdefghijk")  # a refused evaluation writes nothing


@pytest.mark.simulator
def test_rl_training_states_are_new_draws_disjoint_from_evaluation(libero_env):
    states = np.stack(training_init_states(libero_env.sample_init_state, libero_env.init_states, 2, libero_env.task_id))
    assert states.shape == (2, libero_env.init_states.shape[1])
    assert not np.allclose(states[0], states[1])
    # the arm starts off its nominal pose as in the published states (~0.02 rad per joint), not at one fixed pose
    arm = slice(1, 8)  # flattened state: time, then the Panda's 7 arm joints
    assert np.abs(states[0, arm] - states[1, arm]).max() > 0.005
    assert np.abs(states[:, arm] - libero_env.init_states[:, arm].mean(0)).max() < 0.15
    observation = libero_env.reset(states[0])  # a generated state is a valid start
    assert observation.images["agentview"].shape == (224, 224, 3) and not libero_env.success
    with pytest.raises(ValueError, match="equals evaluation init state 7"):
        check_disjoint(np.stack([states[0], libero_env.init_states[7]]), libero_env.init_states, libero_env.task_id)
    with pytest.raises(ValueError, match="leaks the test set"):
        select_rl_init_states([0, 1], 50, allow_eval_states=False, task_id=libero_env.task_id)
    assert select_rl_init_states([0, 1], 50, allow_eval_states=True, task_id=libero_env.task_id) == [0, 1]


@pytest.mark.simulator
def test_samples_per_state_report_avg_best_and_all_at_k_and_resume_per_sample(checkpoint, tmp_path):
    sampled = config(checkpoint, tmp_path, tasks=["0"], trials=2, samples_per_state=2, temperature=1.0, videos="none")
    info = evaluate(sampled, progress=False)
    episodes = tmp_path / "episodes.jsonl"
    keys = sorted((r["trial"], r["sample"]) for r in map(json.loads, episodes.read_text().splitlines()))
    assert keys == [(0, 0), (0, 1), (1, 0), (1, 1)]
    overall = info["overall"]
    assert overall["trials"] == 4 and overall["states"] == 2 and overall["avg"] == overall["success_rate"]
    assert overall["best_at_k"]["trials"] == 2 and overall["all_at_k"]["trials"] == 2
    assert overall["all_at_k"]["successes"] <= overall["best_at_k"]["successes"]
    assert len(overall["ci95"]) == 2 and info["settings"]["samples_per_state"] == 2
    assert "best@2" in (tmp_path / "eval_table.md").read_text()
    lines = episodes.read_text().splitlines()
    episodes.write_text("\n".join(lines[:3]) + "\n")  # as if killed before the last (trial, sample) finished
    evaluate(sampled, progress=False)
    assert episodes.read_text().splitlines()[:3] == lines[:3] and len(episodes.read_text().splitlines()) == 4
    with pytest.raises(ValueError, match="samples_per_state 2: expected 1, or K > 1 with a temperature > 0"):
        evaluate(config(checkpoint, tmp_path / "greedy", samples_per_state=2), progress=False)


@pytest.mark.simulator
def test_compare_pairs_shared_episodes_and_refuses_other_settings(checkpoint, tmp_path, capsys):
    from minivla_wmrl.cli import main as cli

    make_policy(seed=8).save_pretrained(other := tmp_path / "other")
    run = lambda ckpt, out, **kw: evaluate(config(ckpt, tmp_path / out, tasks=["0"], trials=3, videos="none", **kw),  # noqa: E731
                                           progress=False)
    run(checkpoint, "a"), run(checkpoint, "a_again"), run(other, "b"), run(checkpoint, "c", execute_steps=4)
    assert cli(["compare", str(tmp_path / "a"), str(tmp_path / "a_again"), str(tmp_path / "b"),
                "--json", str(tmp_path / "rows.json")]) == 0
    assert "McNemar" in capsys.readouterr().out
    same, different = json.loads((tmp_path / "rows.json").read_text())
    assert (same["episodes"], same["difference"], same["gained"], same["lost"]) == (3, 0, 0, 0)
    assert same["p_mcnemar"] == 1.0 and different["episodes"] == 3
    assert cli(["compare", str(tmp_path / "a"), str(tmp_path / "c")]) == 1
    assert "execute_steps: 8 vs 4" in capsys.readouterr().err
    assert cli(["compare", str(tmp_path / "a"), str(tmp_path / "nothere")]) == 1
    assert "lacks eval_settings.json" in capsys.readouterr().err


def test_eval_info_carries_lerobots_keys_beside_ours():
    """Read as LeRobot's tools read eval_info.json: overall/per_group pc_success and n_episodes, per_task
    task_group/task_id/metrics, eval_s and video_paths (pure logic on recorded episodes)."""
    from minivla_wmrl.evaluation.evaluate import summarize

    episodes = [{"task": 0, "trial": 0, "sample": 0, "success": True, "video": "videos/a.mp4"},
                {"task": 0, "trial": 1, "sample": 0, "success": False, "video": None},
                {"task": 5, "trial": 0, "sample": 0, "success": True, "video": None},
                {"task": 5, "trial": 1, "sample": 0, "success": True, "video": "videos/b.mp4"}]
    records = {(e["task"], e["trial"], e["sample"]): e for e in episodes}
    settings = {"suite": "libero_10", "tasks": [0, 5], "trials": 2, "samples_per_state": 1}
    info = summarize(records, {0: ("t0", "do a"), 5: ("t5", "do b")}, settings, eval_s=8.0, out="runs/x")
    overall = info["overall"]
    assert overall["pc_success"] == 75.0 and overall["n_episodes"] == 4 and overall["eval_s"] == 8.0
    assert overall["eval_ep_s"] == 2.0 and overall["avg_sum_reward"] == overall["avg_max_reward"] == 0.75
    assert overall["video_paths"] == ["runs/x/videos/a.mp4", "runs/x/videos/b.mp4"]
    assert overall["successes"] == 3 and overall["trials"] == 4  # ours, beside
    assert info["per_group"]["libero_10"]["pc_success"] == 75.0
    first, second = info["per_task"]
    assert (first["task_group"], first["task_id"]) == ("libero_10", 0)
    assert first["metrics"]["successes"] == [True, False] and first["metrics"]["sum_rewards"] == [1.0, 0.0]
    assert second["metrics"]["video_paths"] == ["runs/x/videos/b.mp4"]


@pytest.mark.simulator
def test_drawn_init_states_are_evaluated_apart_from_the_published_ones(checkpoint, tmp_path, capsys):
    from minivla_wmrl.cli import main as cli

    run = lambda out, **kw: evaluate(config(checkpoint, tmp_path / out, tasks=["0"], trials=1, first_trial=1,  # noqa: E731
                                            max_steps=8, **kw), progress=False)
    published, validation = run("published"), run("validation", init_states="validation")
    assert validation["settings"]["init_states"] == "validation"
    first_frame = lambda info, out: imageio.mimread(tmp_path / out / info["per_task"][0]["episodes"][0]["video"])[0]  # noqa: E731
    assert np.abs(first_frame(published, "published").astype(int)
                  - first_frame(validation, "validation").astype(int)).mean() > 1.0  # another scene layout
    assert cli(["compare", str(tmp_path / "published"), str(tmp_path / "validation")]) == 1
    assert "init_states: 'published' vs 'validation'" in capsys.readouterr().err


def test_the_recorded_renderer_does_not_depend_on_whether_an_env_was_built_first():
    """A resumed ablation that skips its finished stages evaluates before building any env: its settings
    must still equal those recorded after the stages had built envs (and set up the renderer)."""
    environment = {k: v for k, v in os.environ.items() if k != "PYOPENGL_PLATFORM"} | {"MUJOCO_GL": "egl"}
    code = ("import json, os; from minivla_wmrl.evaluation.evaluate import renderer; first = renderer(); "
            "from envs.gl import prepare_gl; prepare_gl(); print(json.dumps([first, renderer()]))")
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    first, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert first == after == {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}
    # ... and a record written before that fix (no PYOPENGL_PLATFORM yet) reads as the renderer the envs set up
    from minivla_wmrl.evaluation.evaluate import setting
    legacy = {"renderer": {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": None}}
    assert setting(legacy, "renderer") == first
    assert setting({"renderer": {"MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": None}}, "renderer") != first
