"""The gate replayed offline on a recorded full-execution run (pure logic on planted rollouts: the
rollout fields it reads are recorded by the engine, tested on LIBERO in test_rollout.py)."""

import argparse
import json
import typing
from dataclasses import replace

import numpy as np
import pytest

from minivla_wmrl.cli import build_parser
from minivla_wmrl.train.gate import Gate, GateConfig, Predictor
from minivla_wmrl.train.gate_report import WAIT_STEPS, first_cut, replay_gate, replay_oracle, report_table
from tests.test_outcome_probe import CAP, rollout, rollouts


def test_the_first_cut_is_where_the_rule_first_cuts_and_never_at_the_end():
    trajectory = rollouts(0, 2)[0]  # a failure: queries at 0, 8, ..., 112; runs to the cap
    assert not trajectory.success and trajectory.length == CAP
    gate = Gate(GateConfig(min_steps=32, patience=2))
    gate.active, gate.threshold = True, 0.5
    probabilities = np.full(trajectory.num_queries, 0.9)
    probabilities[5:] = 0.1  # decisions after the chunks of queries 5, 6, ...: steps 48, 56, ...
    assert first_cut(gate, probabilities, trajectory) == 56  # two in a row below: after query 6's chunk
    assert first_cut(gate, np.full(trajectory.num_queries, 0.9), trajectory) == CAP
    only_last = np.full(trajectory.num_queries, 0.9)
    only_last[-2:] = 0.1  # the rule would fire at the episode's end: nothing left to cut
    assert first_cut(gate, only_last, trajectory) == CAP
    gate.active = False
    assert first_cut(gate, probabilities, trajectory) == CAP


def run_steps(seed: int, steps: int, planted: bool = True) -> list:
    return [rollouts(seed * 100 + k, 16, planted) for k in range(steps)]


def test_a_replayed_gate_cuts_failures_spares_anchors_and_accounts_every_step():
    steps, config = run_steps(1, 4), GateConfig(predictor="time", min_steps=24, patience=1, wrong_cut_rate=0.1,
                                                min_per_outcome=2)
    report = replay_gate(steps, config, rollouts(2, 40), group_size=4, anchor_fraction=0.25, time_scale=CAP)
    rows, total = report["steps"], report["total"]
    assert not rows[0]["cutting"]  # no anchors have calibrated the gate yet: everything runs to its end
    assert rows[0]["real_steps"] == rows[0]["real_steps_full"] == sum(t.length + WAIT_STEPS for t in steps[0])
    assert all(r["anchors"] == 4 and r["cut"] <= 12 for r in rows)  # one anchor per group of 4, never cut
    assert total["first_cutting_step"] == 2 and total["cut"] > 0
    assert total["failures_cut_share"] > 0.5 and total["successes_cut_share"] < total["failures_cut_share"]
    assert total["real_steps"] < total["real_steps_full"] and total["saving"] > 1.1


def test_a_warm_started_gate_cuts_from_the_first_step():
    """Calibrated first on the extra episodes (cross-fitted), the gate need not wait for successful anchors."""
    steps, extra = run_steps(1, 4), rollouts(2, 40)
    config = GateConfig(predictor="time", min_steps=24, patience=1, wrong_cut_rate=0.1, min_per_outcome=2)
    cold = replay_gate(steps, config, extra, group_size=4, anchor_fraction=0.25, time_scale=CAP)
    warm = replay_gate(steps, replace(config, warm_start=True), extra, group_size=4, anchor_fraction=0.25,
                       time_scale=CAP)
    assert cold["total"]["first_cutting_step"] == 2 and warm["total"]["first_cutting_step"] == 1
    assert warm["steps"][0]["failures_cut"] > 0 and warm["steps"][0]["successes_cut"] == 0
    assert warm["total"]["saving"] > cold["total"]["saving"]
    assert "| time, warm start | 24 |" in report_table([warm]) and "| time | 24 |" in report_table([cold])


def test_the_replay_reads_what_the_predictor_knows_beyond_time():
    """Per step and in total, the gate's AUROC beyond time: exactly 0.5 for time alone, high for a probe
    on planted signals; the table shows the last reading, and a dash for the oracle, which has no gate."""
    steps, extra = run_steps(1, 4), rollouts(2, 40)
    config = GateConfig(predictor="time", min_steps=24, patience=1, wrong_cut_rate=0.1, min_per_outcome=2,
                        warm_start=True)
    time = replay_gate(steps, config, extra, group_size=4, anchor_fraction=0.25, time_scale=CAP)
    probe = replay_gate(steps, replace(config, predictor="policy"), extra, group_size=4, anchor_fraction=0.25,
                        time_scale=CAP)
    assert [r["gate_auroc_beyond_time"] for r in time["steps"]] == [0.5] * 4
    assert time["total"]["gate_auroc_beyond_time"] == 0.5
    assert probe["total"]["gate_auroc_beyond_time"] > 0.9 and probe["total"]["gate_auroc"] > 0.9
    oracle = replay_oracle(steps, 24, group_size=4, anchor_fraction=0.25)
    table = report_table([time, probe, oracle]).splitlines()
    assert table[2].endswith("| 0.50 |") and table[4].endswith("| - |")
    assert float(table[3].split("|")[-2]) == pytest.approx(probe["total"]["gate_auroc_beyond_time"], abs=0.005)
    json.dumps(time, allow_nan=False)  # too few to rank is null, not NaN
    cold = replay_gate(steps, replace(config, warm_start=False), extra, group_size=4, anchor_fraction=0.25,
                       time_scale=CAP)
    assert cold["steps"][0]["gate_auroc_beyond_time"] is None and cold["steps"][0]["gate_auroc"] is None


def test_the_oracle_cuts_exactly_the_non_anchor_failures_of_the_gates_anchors():
    """The perfect predictor: same anchors as a replayed gate with the same seed, every other failure
    cut at its first decision at or after min_steps, never a success; no gate saves more."""
    steps, extra = run_steps(1, 4), rollouts(2, 40)
    config = GateConfig(predictor="time", min_steps=24, patience=1, wrong_cut_rate=0.1, min_per_outcome=2,
                        warm_start=True)
    gate = replay_gate(steps, config, extra, group_size=4, anchor_fraction=0.25, time_scale=CAP)
    oracle = replay_oracle(steps, 24, group_size=4, anchor_fraction=0.25)
    assert all(t.length == CAP for step in steps for t in step if not t.success)  # planted failures run to the cap
    for g, o in zip(gate["steps"], oracle["steps"]):
        assert o["anchors"] == g["anchors"] == 4 and o["non_anchor_failures"] == g["non_anchor_failures"]
        assert o["successes_cut"] == 0 and o["failures_cut"] == o["non_anchor_failures"] > 0
        assert o["real_steps_full"] - o["real_steps"] == o["failures_cut"] * (CAP - 24)  # each cut at step 24
    assert oracle["total"]["saving"] >= gate["total"]["saving"] > 1.0
    assert "| oracle | 24 | 1 | 0.0 |" in report_table([oracle])


def test_a_gate_stays_shut_while_no_success_has_been_seen():
    rng = np.random.default_rng(3)
    steps = [[rollout(rng, False) for _ in range(16)] for _ in range(3)]  # a task the policy never solves
    report = replay_gate(steps, GateConfig(predictor="policy", min_per_outcome=2), [], 4, 0.25, CAP)
    assert report["total"]["cut"] == 0 and report["total"]["saving"] == 1.0
    assert report["total"]["first_cutting_step"] is None


def test_the_gate_report_command_prints_and_writes_every_setting(tmp_path, capsys):
    from minivla_wmrl.cli import main as cli
    from minivla_wmrl.data.replay import write_replay

    for k, step in enumerate(run_steps(5, 3), 1):
        write_replay(tmp_path / "run" / f"step_{k:07d}.hdf5", step, f"grpo step {k}")
    write_replay(tmp_path / "wm" / "collect.hdf5", rollouts(6, 40), "collect")
    assert cli(["gate-report", str(tmp_path / "run"), "--replay", str(tmp_path / "wm"), "--predictor", "time", "oracle",
                "--min-steps", "16", "32", "--wrong-cut-rate", "0.1", "--min-per-outcome", "3",
                "--threshold-rule", "quantile", "conformal", "--time-scale", str(CAP),
                "--json", str(tmp_path / "report.json")]) == 0
    out = capsys.readouterr().out
    assert "3 steps, 48 rollouts" in out and "| time | 16 | 2 | 0.1 |" in out and "| time | 32 | 2 | 0.1 |" in out
    assert "| time, conformal | 16 | 2 | 0.1 |" in out and "| time, conformal | 32 | 2 | 0.1 |" in out
    assert "| oracle | 16 | 1 | 0.0 |" in out and "| oracle | 32 | 1 | 0.0 |" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["extra"] == 40
    assert [(r["gate"]["predictor"], r["gate"]["min_steps"], r["gate"].get("threshold_rule"))
            for r in report["reports"]] == [("oracle", 16, None), ("oracle", 32, None), ("time", 16, "quantile"),
                                            ("time", 16, "conformal"), ("time", 32, "quantile"),
                                            ("time", 32, "conformal")]
    assert {r["gate"]["min_per_outcome"] for r in report["reports"][2:]} == {3}
    assert cli(["gate-report", str(tmp_path / "wm")]) == 1
    assert "no step_*.hdf5 replay files" in capsys.readouterr().err
    assert cli(["gate-report", str(tmp_path / "run"), "--warm-start"]) == 1
    assert "--warm-start calibrates the gate on the --replay episodes" in capsys.readouterr().err
    assert cli(["gate-report", str(tmp_path / "run"), "--wrong-cut-rate", "1.5"]) == 1
    assert "wrong_cut_rate" in capsys.readouterr().err


@pytest.mark.parametrize("fraction", ["0", "1"])
def test_the_gate_report_needs_non_anchors(tmp_path, capsys, fraction):
    from minivla_wmrl.cli import main as cli
    from minivla_wmrl.data.replay import write_replay

    write_replay(tmp_path / "run" / "step_0000001.hdf5", rollouts(7, 8), "grpo step 1")
    assert cli(["gate-report", str(tmp_path / "run"), "--anchor-fraction", fraction]) == 1
    assert "--anchor-fraction" in capsys.readouterr().err


def test_the_gate_report_offers_every_predictor_the_gate_knows():
    """The command line lists the choices by hand (it imports nothing heavy): they must stay gate.Predictor's."""
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    predictor = next(a for a in commands.choices["gate-report"]._actions if a.dest == "predictor")
    assert list(predictor.choices) == [*typing.get_args(Predictor), "oracle"]
