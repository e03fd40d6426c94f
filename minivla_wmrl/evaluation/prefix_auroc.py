"""How much a rollout's prefix tells about its final outcome: held-out AUROC by prefix length of
the outcome probe on the policy's own signals, and on them with the robot's proprioception (what a
real robot also has), against a time-only baseline and the privileged probe (simulator state: an
upper bound of what the prefix holds).

At a cut point of L env steps, an episode that already ended is known (what a gate never has to
guess); the ones still running are what a gate must rank. Each row reports AUROC over the running
episodes (`*_running`; time alone cannot rank these: 0.5 by construction) and over all episodes,
ended ones scored by their known outcome (`*_all`, where time-only is P(success | still running at L)
and earns what early endings give away).
"""

from __future__ import annotations

import numpy as np

from minivla_wmrl.data.replay import read_replay
from minivla_wmrl.evaluation.statistics import auroc
from minivla_wmrl.infra.outputs import write_json_output
from minivla_wmrl.rl.rollout import Trajectory
from world_models.outcome_probe import ProbeEpisode, fit_outcome_probe, policy_signals

SIGNALS = ("policy", "proprio", "privileged")
REPORT_NAMES = {"policy": "probe", "proprio": "proprio", "privileged": "privileged"}  # the report's columns


def probe_episode(trajectory: Trajectory, signals: str = "policy") -> ProbeEpisode:
    """A real-labelled trajectory as a probe reads it: its policy signals (`policy`), those with the
    robot's proprioception per query (`proprio`), or its privileged state."""
    if signals not in SIGNALS:
        raise ValueError(f"probe signals {signals!r}: expected one of {SIGNALS}")
    t = trajectory
    if len(t.actions) != t.num_queries:
        raise ValueError(f"trajectory of {t.spec.task_id} (init state {t.spec.init_state}) has no recorded actions "
                         "per query; it was not run by this version's rollout engine")
    if signals == "privileged":
        return ProbeEpisode(np.asarray(t.privileged, np.float32), t.query_steps, t.instruction, t.success, t.length)
    features = policy_signals(t.query_steps, t.log_probs, t.actions)
    if signals == "proprio":
        if not has_proprio(t):
            raise ValueError(f"trajectory of {t.spec.task_id} (init state {t.spec.init_state}) has no proprioception "
                             f"per query (got shape {np.shape(t.proprio)} for {t.num_queries} queries); replay files "
                             "written before it was recorded serve the `policy` and `privileged` probes only")
        features = np.concatenate([features, np.asarray(t.proprio, np.float32)], axis=1)
    return ProbeEpisode(features, t.query_steps, t.instruction, t.success, t.length)


def has_proprio(trajectory: Trajectory) -> bool:
    """Whether the trajectory recorded proprioception at each of its queries."""
    return np.ndim(trajectory.proprio) == 2 and len(trajectory.proprio) == trajectory.num_queries


def prediction_at(probabilities: np.ndarray, query_steps: np.ndarray, steps: int) -> float:
    """The prediction after `steps` env steps: the output at the last query issued before then."""
    issued = np.flatnonzero(np.asarray(query_steps) < steps)
    return float(probabilities[issued[-1]]) if len(issued) else float("nan")


def time_only(train: list[ProbeEpisode]):
    """P(success | still running after L steps) from the training episodes (Laplace-smoothed)."""
    lengths = np.array([e.length for e in train])
    successes = np.array([e.success for e in train], bool)

    def at(steps: int) -> float:
        running = lengths > steps
        return (successes[running].sum() + 1) / (running.sum() + 2)

    return at


def auroc_by_prefix(test: list[ProbeEpisode], predictions: dict[str, list[np.ndarray]],
                    prefix_steps: list[int], baseline=None) -> list[dict]:
    """Per cut point: AUROC of each predictor over running episodes and over all (see the module doc)."""
    outcomes = np.array([e.success for e in test], float)
    rows = []
    for steps in prefix_steps:
        running = np.array([e.length > steps for e in test])
        row = {"steps": steps, "running": int(running.sum()), "running_successes": int(outcomes[running].sum())}
        for name, probabilities in predictions.items():
            at = np.array([prediction_at(p, e.query_steps, steps) for p, e in zip(probabilities, test)])
            known = np.where(running, at, outcomes)  # an ended episode's outcome is known
            row[f"{name}_running"] = auroc(at[running], outcomes[running])
            row[f"{name}_all"] = auroc(known, outcomes)
        if baseline is not None:
            row["time_only_all"] = auroc(np.where(running, baseline(steps), outcomes), outcomes)
        rows.append(row)
    return rows


def prefix_report(train: list[Trajectory], test: list[Trajectory], prefix_steps: list[int],
                  time_scale: float = 520.0, seed: int = 0) -> dict:
    """Fit the probes on `train` (the proprioceptive one where every episode recorded proprioception);
    AUROC by prefix on `test`."""
    predictions, fitted = {}, {}
    for signals in SIGNALS:
        if signals == "proprio" and not all(map(has_proprio, train + test)):
            continue
        train_episodes = [probe_episode(t, signals) for t in train]
        test_episodes = [probe_episode(t, signals) for t in test]
        fitted[signals] = train_episodes
        probe = fit_outcome_probe(train_episodes, time_scale=time_scale, seed=seed)
        predictions[REPORT_NAMES[signals]] = probe.predict(test_episodes)
    rows = auroc_by_prefix(test_episodes, predictions, prefix_steps, time_only(fitted["policy"]))
    return {"train": len(train), "test": len(test), "train_successes": int(sum(t.success for t in train)),
            "test_successes": int(sum(t.success for t in test)), "rows": rows}


def prefix_table(report: dict) -> str:
    """The report as markdown."""
    names = [n for n in REPORT_NAMES.values() if f"{n}_running" in report["rows"][0]]
    columns = [f"{n}, running" for n in names] + [f"{n}, all" for n in names] + ["time only, all"]
    lines = [f"held-out AUROC of the final outcome by prefix ({report['test']} test episodes, "
             f"{report['test_successes']} successes; probes fit on {report['train']})", "",
             "| steps | running (successes) | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for r in report["rows"]:
        values = [r[f"{n}_running"] for n in names] + [r[f"{n}_all"] for n in names] + [r["time_only_all"]]
        lines.append(f"| {r['steps']} | {r['running']} ({r['running_successes']}) | "
                     + " | ".join(f"{v:.2f}" for v in values) + " |")
    return "\n".join(lines) + "\n"


def main(args) -> None:
    """`minivla-wmrl probe-report REPLAY...`: split the replay store's episodes into probe training and
    held-out test episodes (by episode, seeded; or the `--test` files), fit both probes, print the table."""
    if not 0 < args.test_fraction < 1:
        raise ValueError(f"--test-fraction {args.test_fraction}: expected a share of the episodes in (0, 1)")
    episodes = read_replay(args.replay)
    if args.test:
        train, test = episodes, read_replay(args.test)
    else:
        order = np.random.default_rng(args.seed).permutation(len(episodes))
        cut = int(round(args.test_fraction * len(episodes)))
        test, train = [episodes[k] for k in order[:cut]], [episodes[k] for k in order[cut:]]
    if len(train) < 4 or not test or len({t.success for t in test}) < 2:
        raise ValueError(f"{len(episodes)} replay episodes ({sum(t.success for t in episodes)} successes) leave "
                         f"{len(train)} to train and {len(test)} to test; the report needs >= 4 to train and test "
                         "episodes of both outcomes: collect more")
    report = prefix_report(train, test, args.steps, args.time_scale, args.seed)
    print(prefix_table(report))
    if args.json:
        write_json_output(args.json, report)
