"""`minivla-wmrl ablate RECIPE`: GRPO arms × seeds from one SFT checkpoint, judged on held-out states.

The recipe is a pipeline recipe (`minivla-wmrl run`) with an `ablation:` section. The pipeline's
stages up to the world model run once (finished stages are kept); then every (arm, seed) cell
trains GRPO from the same SFT checkpoint and the same initial world model, with the arm's
overrides, and each of its evaluated checkpoints runs the recipe's `eval` protocol on the same
held-out init states as the SFT checkpoint (same trials, samples and sampling seeds), so every
comparison is paired episode by episode.

Seeds: arm i runs GRPO with seed `s + 1000 × i` for each `s` in `seeds`, so no two arms share
rollouts and each cell is an independent observation; `paired_seeds: true` gives every arm the
same seeds (common random numbers) instead. The output says which.

Outputs under `OUT/ablation/`: one directory per cell (`<arm>/seed<s>/`: the GRPO run,
`eval/step_N/` per evaluated checkpoint, `cell.json` when done: a re-run skips it, after
checking that it ran the GRPO settings the recipe asks for now),
`eval/sft/`, and `ablation.json`, `ablation.md` and `ablation.png` (held-out success against
cumulative real-simulator steps).
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from minivla_wmrl.atomic import atomic_file
from minivla_wmrl.checkpoint import read_json, recipe_differences
from minivla_wmrl.config import apply_overrides, config_from_dict, load_recipe
from minivla_wmrl.plots import plot_ablation
from minivla_wmrl.statistics import mean_interval, mcnemar_exact, paired_difference, rate

SEED_STRIDE = 1000  # arm i, seed s → GRPO seed s + SEED_STRIDE × i (unless paired_seeds)
CELL_MAY_DIFFER = ("out", "resume", "env.backend", "env.ray_address", "env.envs_per_worker",
                   "policy.device")  # do not change results


@dataclass
class Arm:
    name: str  # a directory name: letters, digits, '_' and '-'
    overrides: list[str] = field(default_factory=list)  # GRPO recipe `key=value`s, e.g. ["grpo.reward_mode=sparse"]
    seeds: list[int] | None = None  # this arm's seeds (default: the ablation's), e.g. one for a deterministic control


@dataclass
class AblationConfig:
    arms: list[Arm] = field(default_factory=list)  # the first arm is the one the others are compared with
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    paired_seeds: bool = False  # True: every arm uses the same GRPO seeds (common random numbers)
    eval_every: int = 0  # also evaluate checkpoints at multiples of this GRPO step (0: the final one only)


def cell_recipe(recipe, arm_index: int, seed: int):
    """The GRPO recipe of one (arm, seed) cell: the pipeline's GRPO section + the arm's overrides."""
    from minivla_wmrl.train.grpo import GRPORecipe

    ablation, arm = recipe.ablation, recipe.ablation.arms[arm_index]
    data = apply_overrides(asdict(recipe.grpo), arm.overrides)
    grpo = config_from_dict(GRPORecipe, data, f"ablation arm {arm.name!r}")
    grpo.grpo.seed = seed if ablation.paired_seeds else seed + SEED_STRIDE * arm_index
    grpo.out = str(cell_dir(recipe, arm.name, seed))
    return grpo


def arm_seeds(ablation: AblationConfig, arm: Arm) -> list[int]:
    return list(ablation.seeds if arm.seeds is None else arm.seeds)


def cell_dir(recipe, arm: str, seed: int) -> Path:
    return Path(recipe.out) / "ablation" / arm / f"seed{seed}"


def checkpoint_step(checkpoint: Path) -> int:
    """The GRPO step of a `checkpoints/step_N` directory."""
    return int(checkpoint.name.split("_")[1])


def evaluated_steps(checkpoints: list[Path], eval_every: int) -> list[Path]:
    """The final checkpoint and those at multiples of `eval_every`."""
    steps = sorted(checkpoints, key=checkpoint_step)
    return [p for p in steps if p == steps[-1] or (eval_every and checkpoint_step(p) % eval_every == 0)]


def run_cell(recipe_data: dict, arm_index: int, seed: int) -> dict:
    """Train one cell's GRPO run (resuming it if interrupted), evaluate its checkpoints, write cell.json."""
    from minivla_wmrl.evaluate import evaluate
    from minivla_wmrl.pipeline import Pipeline, PipelineRecipe
    from minivla_wmrl.train.grpo import train_grpo

    recipe = config_from_dict(PipelineRecipe, recipe_data, "ablation recipe")
    pipeline = Pipeline(recipe)
    grpo = cell_recipe(recipe, arm_index, seed)
    directory = Path(grpo.out)
    start = time.perf_counter()
    train_grpo(grpo, progress=False)
    train_s = time.perf_counter() - start
    metrics = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    by_step = {m["step"]: m for m in metrics}
    evaluations = []
    for checkpoint in evaluated_steps(list((directory / "checkpoints").glob("step_*")), recipe.ablation.eval_every):
        step = checkpoint_step(checkpoint)
        info = evaluate(pipeline.eval_config(checkpoint, directory / "eval" / checkpoint.name), progress=False)
        evaluations.append({"step": step, "eval_dir": str(directory / "eval" / checkpoint.name),
                            "real_steps": by_step[step]["real_steps"], "real_episodes": by_step[step]["real_episodes"],
                            "success": info["overall"]})
    cell = {"arm": recipe.ablation.arms[arm_index].name, "seed": seed, "grpo_seed": grpo.grpo.seed,
            "evaluations": evaluations, "train_success_first": metrics[0]["success_rate"],
            "train_success_last": metrics[-1]["success_rate"],
            "train_success_mean_last3": float(np.mean([m["success_rate"] for m in metrics[-3:]])),
            "grpo_steps": metrics[-1]["step"], "real_steps": metrics[-1]["real_steps"],
            "real_episodes": metrics[-1]["real_episodes"], "train_s": train_s,
            **{k: metrics[-1].get(k, 0) for k in ("real_steps_full", "real_steps_horizon", "truncated_episodes")},
            "calibration_auroc": metrics[-1].get("calibration_auroc"),
            "wall_s": time.perf_counter() - start}
    with atomic_file(directory / "cell.json") as tmp:
        tmp.write_text(json.dumps(cell, indent=2))
    return cell


def check_ablation(recipe) -> None:
    from minivla_wmrl.train.grpo import validate

    ablation = recipe.ablation
    if not ablation.arms:
        raise ValueError("ablation.arms is empty; list the GRPO arms to compare (name + overrides)")
    names = [arm.name for arm in ablation.arms]
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_-]+", n)]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"ablation arm names must be unique directory names ([A-Za-z0-9_-]); got {names}")
    for arm in ablation.arms:
        seeds = arm_seeds(ablation, arm)
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError(f"ablation arm {arm.name!r}: seeds must be distinct and non-empty, got {seeds}")
    if ablation.eval_every < 0:
        raise ValueError(f"ablation.eval_every must be >= 0, got {ablation.eval_every}")
    for i, arm in enumerate(ablation.arms):  # every arm's overrides name real keys with valid values, before any work
        validate(cell_recipe(recipe, i, arm_seeds(ablation, arm)[0]))
    for i, arm in enumerate(ablation.arms):  # a finished cell is reused only if it ran the settings asked for now
        for seed in arm_seeds(ablation, arm):
            directory = cell_dir(recipe, arm.name, seed)
            if (directory / "cell.json").exists():
                saved = read_json(directory / "recipe.json", "the cell's GRPO recipe")
                changed = recipe_differences(saved, asdict(cell_recipe(recipe, i, seed)), CELL_MAY_DIFFER)
                if changed:
                    raise ValueError(f"ablation cell {directory} finished with other settings than the recipe's now: "
                                     f"{'; '.join(changed)}; restore them, or delete the cell to run it again")


def run_ablation(recipe, parallel: int = 1) -> dict:
    """Stages demos…wm (finished ones kept), the SFT evaluation, every cell, then the report."""
    from minivla_wmrl.evaluate import evaluate
    from minivla_wmrl.pipeline import Pipeline

    pipeline = Pipeline(recipe)  # fills in the SFT checkpoint and world model every cell starts from
    check_ablation(recipe)
    if parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {parallel}")
    out = Path(recipe.out) / "ablation"
    start = time.perf_counter()
    pipeline.run(("demos", "vq", "sft", "wm"), skip_finished=True)
    sft_eval = out / "eval" / "sft"
    evaluate(pipeline.eval_config(Path(recipe.out) / "sft" / "final", sft_eval))
    ablation = recipe.ablation
    todo = [(i, s) for i, arm in enumerate(ablation.arms) for s in arm_seeds(ablation, arm)
            if not (cell_dir(recipe, arm.name, s) / "cell.json").exists()]
    data = asdict(recipe)
    if parallel == 1:
        for i, s in todo:
            print(f"== ablation cell: arm {ablation.arms[i].name}, seed {s}", flush=True)
            run_cell(data, i, s)
    else:
        with ProcessPoolExecutor(parallel, mp_context=get_context("spawn")) as pool:
            for future in [pool.submit(run_cell, data, i, s) for i, s in todo]:
                future.result()
    report = summarize_ablation(recipe, sft_eval)
    report["wall_s_this_invocation"] = time.perf_counter() - start
    with atomic_file(out / "ablation.json") as tmp:
        tmp.write_text(json.dumps(report, indent=2))
    with atomic_file(out / "ablation.md") as tmp:
        tmp.write_text(ablation_table(report))
    plot_ablation(report, out / "ablation.png")
    print(ablation_table(report))
    return report


def _read_cell(directory: Path) -> dict:
    """A finished cell, its success figures read from the evaluations on disk (the episodes the
    paired comparisons use), not from the copy in cell.json."""
    cell = json.loads((directory / "cell.json").read_text())
    for evaluation in cell["evaluations"]:  # where the cell directory is now, whatever the working directory
        evaluation["eval_dir"] = str(directory / "eval" / Path(evaluation["eval_dir"]).name)
        evaluation["success"] = json.loads((Path(evaluation["eval_dir"]) / "eval_info.json").read_text())["overall"]
    return cell


def _successes(eval_dir: Path, seed_index: int) -> dict:
    """Success by ((task, trial), (seed index, sample)): the bootstrap unit is the init state."""
    from minivla_wmrl.compare import load_evaluation

    _, results = load_evaluation(eval_dir)
    return {((task, trial), (seed_index, sample)): v for (task, trial, sample), v in results.items()}


def summarize_ablation(recipe, sft_eval: Path) -> dict:
    """Per arm: held-out success per seed and over seeds, paired differences to SFT and to the first
    arm (pooled over seeds, paired on init state and sample), agreement with SFT, real-simulator use."""
    from minivla_wmrl.compare import check_comparable, load_evaluation

    ablation = recipe.ablation
    sft_settings, _ = load_evaluation(sft_eval)
    most_seeds = max(len(arm_seeds(ablation, arm)) for arm in ablation.arms)
    sft = {s_index: _successes(sft_eval, s_index) for s_index in range(most_seeds)}
    arms, finals = [], {}
    for i, arm in enumerate(ablation.arms):
        cells = [_read_cell(cell_dir(recipe, arm.name, s)) for s in arm_seeds(ablation, arm)]
        sft_pooled = {k: v for s_index in range(len(cells)) for k, v in sft[s_index].items()}
        final = {}
        for s_index, cell in enumerate(cells):
            last = Path(cell["evaluations"][-1]["eval_dir"])
            check_comparable(sft_settings, load_evaluation(last)[0], str(sft_eval), str(last))
            final.update(_successes(last, s_index))
        finals[arm.name] = final
        per_seed = [c["evaluations"][-1]["success"]["success_rate"] for c in cells]
        vs_sft_per_seed = []
        for s_index, cell in enumerate(cells):
            mine = {k: v for k, v in final.items() if k[1][0] == s_index}
            gained = sum(1 for k in mine if mine[k] and not sft[s_index][k])
            lost = sum(1 for k in mine if sft[s_index][k] and not mine[k])
            vs_sft_per_seed.append({"seed": cell["seed"], "gained": gained, "lost": lost,
                                    "p_mcnemar": mcnemar_exact(gained, lost)})
        aurocs = [c["calibration_auroc"] for c in cells
                  if c.get("calibration_auroc") is not None and np.isfinite(c["calibration_auroc"])]
        arms.append({
            "arm": arm.name, "overrides": arm.overrides, "seeds": [c["seed"] for c in cells],
            "grpo_seeds": [c["grpo_seed"] for c in cells],
            "held_out_per_seed": per_seed, "held_out": mean_interval(per_seed),
            "held_out_pooled": rate(sum(final.values()), len(final)),
            "vs_sft": paired_difference(sft_pooled, final), "vs_sft_per_seed": vs_sft_per_seed,
            "identical_to_sft": sum(final[k] == sft_pooled[k] for k in final), "episodes": len(final),
            "train_success_first": mean_interval([c["train_success_first"] for c in cells]),
            "train_success_last3": mean_interval([c["train_success_mean_last3"] for c in cells]),
            "grpo_steps": [c["grpo_steps"] for c in cells],
            "real_steps": mean_interval([c["real_steps"] for c in cells]),
            "real_episodes": mean_interval([c["real_episodes"] for c in cells]),
            "real_steps_per_grpo_step": float(np.mean([c["real_steps"] / c["grpo_steps"] for c in cells])),
            "real_steps_horizon_share": float(np.mean([c.get("real_steps_horizon", 0) / c["real_steps"]
                                                       for c in cells])),
            "calibration_auroc": mean_interval(aurocs) if aurocs else None,
            "wall_s": mean_interval([c["wall_s"] for c in cells]),
            "curve": _curve(cells),
        })
    first = ablation.arms[0].name
    sft_info = json.loads((sft_eval / "eval_info.json").read_text())
    target = arms[0]["curve"][-1]["success"]["mean"]  # the first arm's final held-out success
    first_needs = steps_to_reach(arms[0]["curve"], sft_info["overall"]["success_rate"], target)
    for entry in arms:
        entry["steps_to_first_arm_final"] = needs = steps_to_reach(entry["curve"], sft_info["overall"]["success_rate"],
                                                                   target)
        entry["real_step_ratio"] = first_needs / needs if needs and first_needs is not None else None
    for entry in arms[1:]:  # on the seed indices both arms ran
        entry["vs_first_arm"] = paired_difference(finals[first], finals[entry["arm"]])
    return {"sft": sft_info["overall"], "eval_settings": sft_settings, "arms": arms, "first_arm": first,
            "seeding": "paired: every arm uses the same GRPO seeds" if ablation.paired_seeds else
                       f"independent: arm i uses GRPO seed s + {SEED_STRIDE} × i",
            "grpo": {k: v for k, v in asdict(recipe.grpo.grpo).items() if k != "seed"}}


def _curve(cells: list[dict]) -> list[dict]:
    """Held-out success against cumulative real steps: mean over seeds at each evaluated GRPO step."""
    steps = sorted({e["step"] for c in cells for e in c["evaluations"]})
    curve = []
    for step in steps:
        points = [e for c in cells for e in c["evaluations"] if e["step"] == step]
        curve.append({"step": step, "seeds": len(points),
                      "real_steps": float(np.mean([p["real_steps"] for p in points])),
                      "success": mean_interval([p["success"]["success_rate"] for p in points])})
    return curve


def steps_to_reach(curve: list[dict], sft_success: float, target: float) -> float | None:
    """Cumulative real-simulator steps at which the mean held-out success curve (starting from the
    SFT checkpoint at 0 steps) first reaches `target`, interpolated linearly between evaluated
    checkpoints; None if it never does."""
    points = [(0.0, sft_success)] + [(p["real_steps"], p["success"]["mean"]) for p in curve]
    if sft_success >= target:
        return 0.0
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if y1 >= target:  # y0 < target <= y1
            return x0 + (x1 - x0) * (target - y0) / (y1 - y0)
    return None


def _pct(interval) -> str:
    return "n/a" if interval is None else f"[{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"


def ablation_table(report: dict) -> str:
    s, sft = report["eval_settings"], report["sft"]
    lines = [f"# Ablation: held-out success ({s['suite']} tasks {s['tasks']}, init states {s['first_trial']}.."
             f"{s['first_trial'] + s['trials'] - 1}, {s['samples_per_state']} sample(s) each, {s['sampling']}, "
             f"cap {s['max_steps']})", "",
             f"SFT: {sft['successes']}/{sft['trials']} = {100 * sft['success_rate']:.1f}% "
             f"{_pct(sft['ci95'])} (Wilson). "
             f"Seeds: {report['seeding']}.", "",
             "| arm | held-out success, mean over seeds [95% t] | per seed | vs SFT, paired [95% CI] | "
             f"vs {report['first_arm']}, paired [95% CI] | same as SFT | training success first → last 3 | "
             "real episodes | real steps | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in report["arms"]:
        d = arm["vs_sft"]
        first = arm.get("vs_first_arm")
        vs_first = "-" if first is None else (f"{100 * first['difference']:+.1f} {_pct(first['ci95'])}, "
                                              f"p={first['p_mcnemar']:.3g}")
        lines.append(
            f"| {arm['arm']} | {100 * arm['held_out']['mean']:.1f}% {_pct(arm['held_out']['ci95'])} | "
            + ", ".join(f"{100 * x:.0f}%" for x in arm["held_out_per_seed"])
            + f" | {100 * d['difference']:+.1f} {_pct(d['ci95'])}, +{d['gained']}/−{d['lost']}, "
            f"p={d['p_mcnemar']:.3g} | "
            f"{vs_first} | {arm['identical_to_sft']}/{arm['episodes']} | "
            f"{100 * arm['train_success_first']['mean']:.0f}% → {100 * arm['train_success_last3']['mean']:.0f}% | "
            f"{arm['real_episodes']['mean']:.0f} | {arm['real_steps']['mean']:.0f} | {arm['wall_s']['mean']:.0f} |")
    lines += ["", "Paired differences pool the seeds: each seed's checkpoint against the SFT checkpoint (or the first "
              "arm's checkpoint of the same seed index) on the same init state and sampling seed; the interval is a "
              "bootstrap over init states, p the exact McNemar test of the discordant episodes.", "",
              f"Real-simulator cost, measured: steps the envs executed. Ratio: real steps {report['first_arm']} "
              "needs to "
              f"reach its final held-out success over the steps the arm needs to reach it (mean curves, linear between "
              "evaluated checkpoints; > 1: cheaper).", "",
              f"| arm | real steps per GRPO step (× fewer than {report['first_arm']}) | share cut at the horizon | "
              "world-model AUROC on calibration pairs | "
              f"real steps to reach {report['first_arm']}'s final success | ratio |",
              "|---|---|---|---|---|---|"]
    per_step_first = report["arms"][0]["real_steps_per_grpo_step"]
    starred = False
    for arm in report["arms"]:
        needs, ratio = arm["steps_to_first_arm_final"], arm["real_step_ratio"]
        single = len(arm["curve"]) == 1 and needs is not None and needs < arm["curve"][0]["real_steps"]
        starred |= single
        auroc = arm.get("calibration_auroc")
        auroc_text = "-" if auroc is None else f"{auroc['mean']:.2f}" + (
            "" if auroc["ci95"] is None else f" [{auroc['ci95'][0]:.2f}, {auroc['ci95'][1]:.2f}]")
        lines.append(f"| {arm['arm']} | {arm['real_steps_per_grpo_step']:.0f} "
                     f"({per_step_first / arm['real_steps_per_grpo_step']:.2f}×) | "
                     f"{100 * arm['real_steps_horizon_share']:.0f}% | "
                     f"{auroc_text} | "
                     f"{'not reached' if needs is None else f'{needs:.0f}'}{' *' if single else ''} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'}{' *' if single else ''} |")
    if starred:
        lines += ["", "\\* interpolated on a straight line from SFT to the only evaluated (final) checkpoint: not a "
                  "measurement of when the success was reached; set `ablation.eval_every` for intermediate "
                  "checkpoints."]
    return "\n".join(lines) + "\n"


def main(args) -> None:
    from minivla_wmrl.pipeline import PipelineRecipe

    recipe = load_recipe(PipelineRecipe, Path(args.recipe), args.overrides)
    run_ablation(recipe, args.parallel)
    print(f"ablation: {Path(recipe.out) / 'ablation' / 'ablation.md'}")
