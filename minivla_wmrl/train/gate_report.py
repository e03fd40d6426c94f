"""`minivla-wmrl gate-report RUN_REPLAY`: the gate replayed offline on a full-execution GRPO run.

A sparse (full-execution) GRPO run's replay store (`OUT/replay/step_N.hdf5`) holds every rollout of
every step, run to its end. Replaying it step by step through the gate of `train.gate` shows what a
gate setting would have saved on that policy's rollouts, and at what cost, before hours of GRPO are
spent on it: each step, the outcome predictor is fit on what a gated run would have had by then
(`--replay`, plus the earlier steps' anchors and uncut rollouts), a share `anchor_fraction` of each
group is drawn as anchors, every other rollout is cut at the first chunk the rule cuts it, and the
anchors, scored by the predictor before it learns from them, recalibrate the gate (with
`--warm-start`, first calibrated on the `--replay` episodes, cross-fitted). Exactly the objects and
order GRPO's gated execution uses (`GRPOTrainer.rollouts` and `corrections`). `--predictor oracle`
adds the perfect predictor on the same anchors: every other failure cut at `min_steps`, the most any
predictor could save there. Each step also records the gate's two quality readings as they stood when
it gated that step's rollouts (`gate_auroc`, and `gate_auroc_beyond_time`: what the predictor ranks
beyond time alone; `train.gate`), and the total, their values over the last anchors (null: too few to
rank).

What it cannot show: how the gate's rewards (a cut rollout's prediction, or 0) would have
changed the policy; the rollouts after the first step are the sparse run's, not a gated run's.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from envs.libero_env import NUM_WAIT_STEPS as WAIT_STEPS  # every reset's steps before the first query: real too
from minivla_wmrl.data.replay import read_replay
from minivla_wmrl.infra.config import check_config
from minivla_wmrl.infra.outputs import write_json_output
from minivla_wmrl.rl.anchors import pick_anchors
from minivla_wmrl.rl.rollout import Trajectory
from minivla_wmrl.train.gate import (Gate, GateConfig, OutcomePredictor, anchor_statistics, cross_fit_statistics,
                                     decision_steps)


def first_cut(gate: Gate, probabilities: np.ndarray, trajectory: Trajectory) -> int:
    """The env step at which the gate cuts this rollout (its length when it never does)."""
    steps = decision_steps(trajectory)
    for i in np.flatnonzero(steps < trajectory.length):  # the last decision comes at the end: nothing to cut
        if gate.cuts(probabilities[:i + 1], steps[:i + 1]):
            return int(steps[i])
    return trajectory.length


def draw_anchors(rollouts: int, group_size: int, anchor_fraction: float, rng: np.random.Generator) -> np.ndarray:
    """A step's anchors, drawn as gated execution draws them (at least one per group of `group_size`
    consecutive rollouts); the replayed gates and the oracle draw from the same stream alike, so that one
    seed gives them the same anchors."""
    groups = np.arange(rollouts) // group_size
    return pick_anchors(groups, np.ones(rollouts, bool), anchor_fraction, rng, min_per_group=1)


def replay_gate(steps: list[list[Trajectory]], config: GateConfig, extra: list[Trajectory], group_size: int,
                anchor_fraction: float, time_scale: float, seed: int = 0) -> dict:
    """Replay a full-execution run's steps (each a list of its rollouts, groups of `group_size` in
    order) through the gate; per step and in total: real steps with and without the gate (reset wait
    steps included), rollouts cut, and successes among them."""
    gate, predictor = Gate(config), OutcomePredictor(config.predictor, time_scale, seed)
    rng, labelled, rows = np.random.default_rng(seed), list(extra), []
    if config.warm_start:
        gate.observe(*cross_fit_statistics(extra, config, time_scale, seed))
    for number, rollouts in enumerate(tqdm(steps, desc=f"gate replay ({config.predictor})", leave=False), 1):
        unfit = predictor.fit(labelled)
        anchors = draw_anchors(len(rollouts), group_size, anchor_fraction, rng)
        probabilities = predictor(rollouts) if unfit is None else None
        cutting = probabilities is not None and gate.active
        ends = np.array([t.length for t in rollouts])
        for k in np.flatnonzero(~anchors) if cutting else []:
            ends[k] = first_cut(gate, probabilities[k], rollouts[k])
        rows.append(step_row(number, cutting, gate.threshold if cutting else None, rollouts, anchors, ends)
                    | quality_readings(gate))
        if probabilities is not None:  # the anchors recalibrate the gate, as in GRPO's corrections
            statistics, excess = np.array([anchor_statistics(probabilities[k], rollouts[k], config, predictor)
                                           for k in np.flatnonzero(anchors)]).reshape(-1, 2).T
            gate.observe(statistics, np.array([rollouts[k].success for k in np.flatnonzero(anchors)]), excess)
        labelled += [t for t, end in zip(rollouts, ends) if end == t.length]  # what a gated run's replay would hold
    return {"gate": asdict(config), "anchor_fraction": anchor_fraction, "steps": rows,
            "total": total_of(rows) | quality_readings(gate)}


def quality_readings(gate: Gate) -> dict:
    """The gate's AUROCs over its recent anchors, as `Gate.log` logs them (null where too few to rank:
    JSON has no NaN)."""
    logged = gate.log()
    return {k: None if np.isnan(logged[k]) else float(logged[k]) for k in ("gate_auroc", "gate_auroc_beyond_time")}


def replay_oracle(steps: list[list[Trajectory]], min_steps: int, group_size: int, anchor_fraction: float,
                  seed: int = 0) -> dict:
    """The perfect predictor on the same steps and anchors as `replay_gate` (same seed): every
    non-anchor failure cut at its first decision at or after `min_steps`, no success ever. The most
    any predictor could save under this gate's anchors and minimum horizon."""
    rng, rows = np.random.default_rng(seed), []
    for number, rollouts in enumerate(steps, 1):
        anchors = draw_anchors(len(rollouts), group_size, anchor_fraction, rng)
        ends = np.array([t.length for t in rollouts])
        for k in np.flatnonzero(~anchors):
            decisions = decision_steps(rollouts[k])
            due = decisions[(decisions >= min_steps) & (decisions < ends[k])]
            if not rollouts[k].success and len(due):
                ends[k] = int(due[0])
        rows.append(step_row(number, True, None, rollouts, anchors, ends))
    gate = {"predictor": "oracle", "min_steps": min_steps, "patience": 1, "wrong_cut_rate": 0.0, "warm_start": False}
    return {"gate": gate, "anchor_fraction": anchor_fraction, "steps": rows, "total": total_of(rows)}


def step_row(number: int, cutting: bool, threshold: float | None, rollouts: list[Trajectory], anchors: np.ndarray,
             ends: np.ndarray) -> dict:
    """One replayed step: rollouts cut (those ending before their recorded length), successes and
    failures among them, and real steps with and without the cuts (reset wait steps included)."""
    lengths = np.array([t.length for t in rollouts])
    outcomes = np.array([t.success for t in rollouts], bool)
    cut = ends < lengths
    return {"step": number, "cutting": bool(cutting), "threshold": threshold,
            "rollouts": len(rollouts), "anchors": int(anchors.sum()), "cut": int(cut.sum()),
            "successes_cut": int((cut & outcomes).sum()), "failures_cut": int((cut & ~outcomes).sum()),
            "non_anchor_successes": int((~anchors & outcomes).sum()),
            "non_anchor_failures": int((~anchors & ~outcomes).sum()),
            "real_steps_full": int((lengths + WAIT_STEPS).sum()),
            "real_steps": int((ends + WAIT_STEPS).sum())}


def total_of(rows: list[dict]) -> dict:
    total = {k: sum(r[k] for r in rows) for k in ("rollouts", "cut", "successes_cut", "failures_cut",
                                                  "non_anchor_successes", "non_anchor_failures",
                                                  "real_steps_full", "real_steps")}
    total.update(saving=total["real_steps_full"] / total["real_steps"],
                 successes_cut_share=total["successes_cut"] / max(total["non_anchor_successes"], 1),
                 failures_cut_share=total["failures_cut"] / max(total["non_anchor_failures"], 1),
                 first_cutting_step=next((r["step"] for r in rows if r["cutting"]), None))
    return total


def report_table(reports: list[dict]) -> str:
    """One row per gate setting, as markdown."""
    lines = ["| predictor | min steps | patience | wrong-cut rate | first cutting step | non-anchors cut "
             "| successes cut | failures cut | real steps: fewer by | AUROC beyond time, last anchors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        g, t = r["gate"], r["total"]
        predictor = (g["predictor"] + (", warm start" if g.get("warm_start") else "")
                     + (", conformal" if g.get("threshold_rule") == "conformal" else ""))
        beyond = t.get("gate_auroc_beyond_time")  # the oracle has no gate to read
        lines.append(f"| {predictor} | {g['min_steps']} | {g['patience']} | {g['wrong_cut_rate']} | "
                     f"{t['first_cutting_step'] or '-'} | {t['cut']} | {t['successes_cut']} of "
                     f"{t['non_anchor_successes']} ({t['successes_cut_share']:.0%}) | {t['failures_cut']} of "
                     f"{t['non_anchor_failures']} ({t['failures_cut_share']:.0%}) | {t['saving']:.2f}x | "
                     f"{'-' if beyond is None else f'{beyond:.2f}'} |")
    return "\n".join(lines) + "\n"


def main(args) -> None:
    """Replay RUN_REPLAY (a full-execution run's OUT/replay) through every combination of the settings given."""
    run = Path(args.run_replay)
    files = sorted(run.glob("step_*.hdf5")) if run.is_dir() else []
    if not files:
        raise FileNotFoundError(f"{run}: no step_*.hdf5 replay files; expected the OUT/replay directory of a "
                                "full-execution GRPO run")
    if not 0 < args.anchor_fraction < 1 or args.group_size < 1:
        raise ValueError(f"--anchor-fraction {args.anchor_fraction} and --group-size {args.group_size}: expected a "
                         "share in (0, 1) and a positive group size")
    if args.warm_start and not args.replay:
        raise ValueError("--warm-start calibrates the gate on the --replay episodes: name some")
    steps = [read_replay([f]) for f in files]
    extra = read_replay(args.replay) if args.replay else []
    reports = [replay_oracle(steps, min_steps, args.group_size, args.anchor_fraction, args.seed)
               for min_steps in args.min_steps if "oracle" in args.predictor]
    predictors = [p for p in args.predictor if p != "oracle"]
    for predictor, min_steps, patience, rate, rule in itertools.product(predictors, args.min_steps, args.patience,
                                                                        args.wrong_cut_rate, args.threshold_rule):
        config = replace(GateConfig(), predictor=predictor, min_steps=min_steps, patience=patience,
                         wrong_cut_rate=rate, threshold_rule=rule, min_per_outcome=args.min_per_outcome,
                         warm_start=args.warm_start)
        check_config(config, "gate-report's gate")
        reports.append(replay_gate(steps, config, extra, args.group_size, args.anchor_fraction, args.time_scale,
                                   args.seed))
    print(f"{run}: {len(files)} steps, {sum(map(len, steps))} rollouts; anchors {args.anchor_fraction:g} per group "
          f"of {args.group_size}; predictor first fit on {len(extra)} other episodes\n")
    print(report_table(reports))
    if args.json:
        write_json_output(args.json, {"run": str(run), "extra": len(extra), "reports": reports})
