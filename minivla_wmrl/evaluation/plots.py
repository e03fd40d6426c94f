"""Run plots: training curves of every stage, world-model score vs real success around calibration,
the gate's anchors against its threshold, and an ablation's held-out success against
real-simulator steps. Each PNG has the points it draws beside it (`NAME.png.json`), so a figure
can be checked or re-drawn without reading pixels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CURVES = {"sft": ("loss", "action_accuracy"), "wm": ("loss", "val_success_auroc"),
          "grpo": ("success_rate", "reward_mean_anchor", "val_success"),  # val_success: the guard's checks
          "wmrl": ("success_rate", "cut_rollouts", "val_success")}


def _figure(rows: int, cols: int, panel: tuple[float, float] = (4, 3)):
    import matplotlib  # ~0.5 s with pyplot: only the commands that draw plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(rows, cols, figsize=(panel[0] * cols, panel[1] * rows), squeeze=False)


def _save(plt, figure, path: Path, points: dict) -> Path:
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    plt.close(figure)
    Path(f"{path}.json").write_text(json.dumps(points, indent=1))
    return Path(path)


def _prefix_series(records: list[dict]) -> dict[str, str]:
    """The world model's held-out AUROCs from the first n frames (`wm.train.eval_prefixes`), by n: key → label."""
    frames = {k: int(k.removeprefix("val_prefix").removesuffix("_success_auroc"))
              for r in records for k in r if k.startswith("val_prefix") and k.endswith("_success_auroc")}
    return {k: f"first {n} frames" for k, n in sorted(frames.items(), key=lambda item: item[1])}


def plot_training_curves(run_dir: Path, path: Path) -> Path:
    """One column per stage that logged metrics (sft, wm, grpo), its metrics one under another. The world
    model's held-out success AUROC is drawn beside its AUROCs from episode prefixes, when logged: a whole
    episode shows its outcome, what the gate and truncated scoring need is the prefix's."""
    stages = [s for s in CURVES if (Path(run_dir) / s / "metrics.jsonl").exists()]
    plt, figure, axes = _figure(max(len(keys) for keys in CURVES.values()), max(len(stages), 1))
    drawn = {}
    for col, stage in enumerate(stages):
        records = [json.loads(line) for line in (Path(run_dir) / stage / "metrics.jsonl").read_text().splitlines()]
        for row in range(len(CURVES[stage]), len(axes)):
            axes[row][col].set_visible(False)
        for row, key in enumerate(CURVES[stage]):
            ax = axes[row][col]
            series = {key: "whole episode"} | (_prefix_series(records) if key == "val_success_auroc" else {})
            for name, label in series.items():
                points = [(r["step"], r[name]) for r in records
                          if name in r and r[name] is not None and np.isfinite(r[name])]
                if name == "val_success" and points:  # the starting policy's check, before step 1
                    points.insert(0, (0, next(r["val_success_start"] for r in records if "val_success_start" in r)))
                if points:
                    ax.plot(*zip(*points), marker="." if len(points) < 30 else None, label=label)
                elif name == key and any(key in r for r in records):  # logged, never finite (one outcome held out)
                    ax.text(0.5, 0.5, "logged, never finite", ha="center", va="center", transform=ax.transAxes)
                drawn[f"{stage}: {name}"] = points
            if len(series) > 1:
                ax.legend(fontsize="small")
            ax.set_title(f"{stage}: {key}")
            ax.set_xlabel("step")
    return _save(plt, figure, path, drawn)


def plot_calibration(debiaser, path: Path, bins: int = 10) -> Path:
    """Mean real success per score bin for the anchors' raw and calibrated world-model scores."""
    plt, figure, axes = _figure(1, 2)
    pairs = np.array(debiaser.pairs) if len(debiaser.pairs) else np.zeros((0, 2))
    drawn = {}
    for ax, (title, scores) in zip(axes[0], (("raw world-model score", pairs[:, 0]),
                                             ("calibrated score", debiaser(pairs[:, 0])))):
        if len(scores):
            edges = np.linspace(min(scores.min(), 0), max(scores.max(), 1), bins + 1)
            index = np.clip(np.digitize(scores, edges) - 1, 0, bins - 1)
            means = [(float(scores[index == b].mean()), float(pairs[index == b, 1].mean()))
                     for b in range(bins) if (index == b).any()]
            drawn[title] = means
            ax.plot(*zip(*means), marker="o", label="real success rate")
            ax.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
            ax.legend(fontsize=7)
        ax.set_title(f"{title} ({len(scores)} anchors)")
        ax.set_xlabel("score")
        ax.set_ylabel("real success")
    return _save(plt, figure, path, {"anchors": len(pairs), **drawn})


def plot_gate(gate, path: Path, bins: int = 20) -> Path:
    """The recent anchors' cut statistics (the lowest threshold at which the gate's rule would have cut
    each), successes and failures apart, against the threshold: what the gate cuts and what it spares."""
    plt, figure, axes = _figure(1, 1, panel=(5.5, 3.5))
    ax = axes[0][0]
    statistics, outcomes = np.array(gate.statistics), np.array(gate.outcomes, bool)
    judged = np.isfinite(statistics)  # inf: ended before the rule could judge it
    edges = np.linspace(0, 1, bins + 1)
    drawn = {"anchors": len(statistics), "threshold": gate.threshold, "active": gate.active}
    for label, mask, color in (("successes", outcomes, "tab:green"), ("failures", ~outcomes, "tab:red")):
        values = np.clip(statistics[mask & judged], 0, 1)
        drawn[label] = values.tolist()
        ax.hist(values, bins=edges, alpha=0.6, color=color, label=f"{label} ({len(values)})")
    ax.axvline(gate.threshold, color="black", linestyle="--", label=f"threshold {gate.threshold:.3f}")
    state = "cutting" if gate.active else f"not cutting: {gate.reason}"
    ax.set_title(f"gate: {len(statistics)} recent anchors, AUROC {gate.quality:.2f}\n{state}", fontsize=8)
    ax.set_xlabel("cut statistic (cut when below the threshold)")
    ax.set_ylabel("anchors")
    ax.legend(fontsize=7)
    return _save(plt, figure, path, drawn)


def plot_ablation(report: dict, path: Path) -> Path:
    """Held-out success (mean over seeds, 95% t interval) against cumulative real-simulator steps."""
    plt, figure, axes = _figure(1, 1, panel=(6.5, 4.5))
    ax, sft = axes[0][0], report["sft"]["success_rate"]
    drawn = {}
    for arm in report["arms"]:
        x = [0.0] + [p["real_steps"] for p in arm["curve"]]
        y = [sft] + [p["success"]["mean"] for p in arm["curve"]]
        errors = [[0.0], [0.0]]
        for p in arm["curve"]:
            low, high = p["success"]["ci95"] or (p["success"]["mean"], p["success"]["mean"])
            errors[0].append(p["success"]["mean"] - low)
            errors[1].append(high - p["success"]["mean"])
        ax.errorbar(x, y, yerr=errors, marker="o", capsize=3, label=arm["arm"])
        drawn[arm["arm"]] = list(zip(x, y))
    if "budget" in report:  # where the fixed-cost comparison picks each seed's checkpoint
        ax.axvline(report["budget"]["real_steps"], color="grey", linestyle=":",
                   label=f"{report['first_arm']}'s real steps / {report['budget']['ratio']:g}")
    ax.set_xlabel("cumulative real-simulator steps")
    ax.set_ylabel("held-out success")
    ax.set_title("held-out success vs real-simulator steps (mean over seeds, 95% CI)", fontsize=10)
    ax.legend(fontsize=8)
    return _save(plt, figure, path, drawn)
