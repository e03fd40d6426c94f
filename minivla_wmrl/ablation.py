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
`eval/sft/`, and `ablation.json` (the report and its evidence: every seed's episodes, real
steps and training metrics, and the software versions), `ablation.md` and `ablation.png`
(held-out success against cumulative real-simulator steps; non-inferiority to the first arm at
`budget_ratio` times fewer real steps: each seed's last evaluated checkpoint within that budget
against the first arm's finals). Each further evaluation protocol `P`
in `protocols` (e.g. greedy decoding beside the recipe's sampled one) plays the same checkpoints
and the SFT checkpoint into `eval_P/` directories, with its own report in `eval_P/ablation.json`;
adding one to a finished ablation only evaluates. A protocol may play only some arms and only each
cell's final checkpoint (e.g. four times the episodes where two arms' comparison is decided).
`ablate --from-json ablation.json` recomputes the report from the evidence alone, so a committed JSON
reproduces its tables; given several (one per task), it prints one arm's effect on each task and their
mean with an interval (`--arm`).

Statistics treat the training seed as the unit (`statistics.seed_level_difference`).
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Annotated

import numpy as np

from minivla_wmrl.evaluation.compare import by_state, check_comparable, load_evaluation
from minivla_wmrl.evaluation.evaluate import SettingsChanged, evaluate
from minivla_wmrl.evaluation.plots import plot_ablation
from minivla_wmrl.evaluation.statistics import (
    PLANNING_HALF_WIDTH,
    RATE_BOUNDS,
    SEED_LEVEL_UNIT,
    mean_interval,
    pooled_over_tasks,
    rate,
    seed_level_difference,
    seeds_for_half_width,
)
from minivla_wmrl.infra.atomic import atomic_file
from minivla_wmrl.infra.config import (
    RUNTIME,
    Range,
    apply_overrides,
    check_config,
    config_from_dict,
    load_recipe,
    marked_keys,
)
from minivla_wmrl.infra.outputs import check_output_dir, create_output_dir
from minivla_wmrl.infra.run_checkpoint import read_json, recipe_differences
from minivla_wmrl.infra.versions import run_versions
from minivla_wmrl.pipeline import (
    CONNECTED_GRPO_KEYS,
    Pipeline,
    PipelineRecipe,
    connected_keys_set,
    dry_run,
    gate_replay_real_steps,
    grpo_variant,
)
from minivla_wmrl.train.grpo import GRPOConfig, GRPORecipe, train_grpo, validate
from minivla_wmrl.train.validation import ValidationConfig, ValidationTracker

SEED_STRIDE = 1000  # arm i, seed s → GRPO seed s + SEED_STRIDE × i (unless paired_seeds)
SEED_LIMIT = 2**32  # GRPO seeds reach numpy: 0 <= seed < 2**32
MIN_RATIOS = 40  # a 95% percentile interval needs a value beyond each 2.5% tail
CELL_MAY_DIFFER = marked_keys(GRPORecipe, RUNTIME)  # where and how a cell runs, not what it computes


@dataclass
class Arm:
    name: str  # a directory name: letters, digits, '_' and '-'
    overrides: list[str] = field(default_factory=list)  # GRPO recipe `key=value`s, e.g. ["grpo.reward_mode=sparse"]
    seeds: list[int] | None = None  # this arm's seeds (default: the ablation's), e.g. one for a deterministic control


@dataclass
class Protocol:
    """A further evaluation protocol: the recipe's `eval` section with these overrides."""

    name: str  # a directory name: its evaluations go to `eval_<name>/`
    overrides: list[str] = field(default_factory=list)  # `eval.key=value`s, e.g. ["eval.temperature=0"]
    # each cell's final checkpoint only: e.g. more episodes where the arms' comparison is decided, at a
    # fraction of what every evaluated checkpoint would cost (its report has no steps-to-reach ratios)
    final_only: bool = False
    arms: list[str] = field(default_factory=list)  # the arms whose cells it plays (the first among them); []: all


@dataclass
class AblationConfig:
    arms: list[Arm] = field(default_factory=list)  # the first arm is the one the others are compared with
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    paired_seeds: bool = False  # True: every arm uses the same GRPO seeds (common random numbers)
    # also evaluate checkpoints at multiples of this GRPO step (0: the final one only)
    eval_every: Annotated[int, Range(0)] = 0
    protocols: list[Protocol] = field(default_factory=list)  # further protocols every evaluated checkpoint plays
    # GRPO's validation guard after the fact, with two candidates: on this protocol's episodes (one of
    # `protocols`, e.g. greedy on validation states) a seed keeps its final checkpoint only where it beat
    # SFT (exact McNemar p <= guard_p, as `validation.accept_p`), else SFT's; the report judges that
    # choice on the recipe's own held-out protocol. "": no guarded rows.
    guard_protocol: str = ""
    guard_p: Annotated[float, Range(0, 1)] = 0.05
    # non-inferiority at a fixed real-execution cost: each seed's last evaluated checkpoint within the first
    # arm's mean real steps / budget_ratio (SFT where none is), against the first arm's finals; the default
    # is WMRL's bar of 1.5x fewer real steps. 0: no such rows
    budget_ratio: Annotated[float, Range(0)] = 1.5


@dataclass
class AblationRecipe(PipelineRecipe):
    """A pipeline recipe whose `ablation:` section is read (a plain `run` ignores it)."""

    ablation: AblationConfig = field(default_factory=AblationConfig)


def cell_recipe(recipe, arm_index: int, seed: int):
    """The GRPO recipe of one (arm, seed) cell: the pipeline's GRPO section + the arm's overrides."""
    ablation, arm = recipe.ablation, recipe.ablation.arms[arm_index]
    grpo = grpo_variant(recipe, arm.overrides, cell_dir(recipe, arm.name, seed), f"ablation arm {arm.name!r}")
    grpo.grpo.seed = seed if ablation.paired_seeds else seed + SEED_STRIDE * arm_index
    return grpo


def arm_seeds(ablation: AblationConfig, arm: Arm) -> list[int]:
    return list(ablation.seeds if arm.seeds is None else arm.seeds)


def cell_dir(recipe, arm: str, seed: int) -> Path:
    return Path(recipe.out) / "ablation" / arm / f"seed{seed}"


def eval_dirname(protocol: Protocol | None) -> str:
    """Where a protocol's evaluations go, in each cell and beside the arms: `eval` for the recipe's own."""
    return "eval" if protocol is None else f"eval_{protocol.name}"


def protocol_recipe(recipe, protocol: Protocol | None):
    """The ablation recipe whose `eval` section is `protocol`'s (the recipe itself for its own)."""
    if protocol is None:
        return recipe
    bad = [o for o in protocol.overrides if not o.startswith("eval.")]
    if bad:
        raise ValueError(f"ablation protocol {protocol.name!r} overrides {bad}: a protocol changes only the "
                         "evaluation (eval.key=value); training settings belong to an arm")
    return config_from_dict(AblationRecipe, apply_overrides(asdict(recipe), protocol.overrides),
                            f"ablation protocol {protocol.name!r}")


def protocol_pipeline(recipe, protocol: Protocol | None) -> Pipeline:
    """The pipeline whose `eval_config` is `protocol`'s (suite, tasks and images connected)."""
    if protocol is None:
        return Pipeline(recipe)
    variant = protocol_recipe(recipe, protocol)
    try:
        return Pipeline(variant)
    except ValueError as error:  # e.g. an override of what the pipeline connects (eval.image_convention)
        raise ValueError(f"ablation protocol {protocol.name!r}: {error}") from None


def protocol_config(recipe, protocol: Protocol | None):
    """One (any) checkpoint's evaluation settings under `protocol`: what it plays, for checks."""
    out = Path(recipe.out) / "ablation"
    return protocol_pipeline(recipe, protocol).eval_config(out, out / eval_dirname(protocol))


def trial_range(config) -> range:
    return range(config.first_trial, config.first_trial + config.trials)


def shares_states(a, b) -> bool:
    """Whether two evaluation settings play some of the same init states."""
    return a.init_states == b.init_states and bool(set(trial_range(a)) & set(trial_range(b)))


def guard_of(recipe) -> Protocol | None:
    return next((p for p in recipe.ablation.protocols if p.name == recipe.ablation.guard_protocol), None)


def judged_with_guard(recipe) -> list[Protocol | None]:
    """The protocols whose reports get guarded rows: the recipe's own, and every further one that plays
    none of the guard's states (a choice judged on the episodes it was made on would flatter it)."""
    guard = guard_of(recipe)
    if guard is None:
        return []
    chosen_on = protocol_config(recipe, guard)
    return [p for p in protocols(recipe) if p is None or p is not guard
            and not shares_states(protocol_config(recipe, p), chosen_on)]


def protocols(recipe) -> list[Protocol | None]:
    """Every evaluation protocol of the ablation: the recipe's own (None), then `ablation.protocols`."""
    return [None, *recipe.ablation.protocols]


def plays(protocol: Protocol | None, arm: str) -> bool:
    """Whether `protocol` evaluates `arm`'s cells (the recipe's own protocol plays every arm)."""
    return protocol is None or not protocol.arms or arm in protocol.arms


def played(protocol: Protocol | None, evaluations: list) -> list:
    """Of a cell's evaluated checkpoints (in step order), those `protocol` plays."""
    return evaluations[-1:] if protocol is not None and protocol.final_only else evaluations


def unevaluated(recipe, arm: str, directory: Path) -> bool:
    """Whether a finished cell has a checkpoint some further protocol has not fully evaluated yet."""
    cell = json.loads((directory / "cell.json").read_text())
    return any(not (directory / eval_dirname(p) / Path(e["eval_dir"]).name / "eval_info.json").exists()
               for p in recipe.ablation.protocols if plays(p, arm) for e in played(p, cell["evaluations"]))


def checkpoint_step(checkpoint: Path) -> int:
    """The GRPO step of a `checkpoints/step_N` directory."""
    return int(checkpoint.name.split("_")[1])


def evaluated_steps(checkpoints: list[Path], eval_every: int) -> list[Path]:
    """The final checkpoint and those at multiples of `eval_every`."""
    steps = sorted(checkpoints, key=checkpoint_step)
    return [p for p in steps if p == steps[-1] or (eval_every and checkpoint_step(p) % eval_every == 0)]


def run_cell(recipe_data: dict, arm_index: int, seed: int) -> dict:
    """Train one cell's GRPO run (resuming it if interrupted), evaluate its checkpoints, write cell.json;
    then evaluate them with each further protocol (a finished cell only does that)."""
    recipe = config_from_dict(AblationRecipe, recipe_data, "ablation recipe")
    grpo = cell_recipe(recipe, arm_index, seed)
    directory = Path(grpo.out)
    cell = (json.loads((directory / "cell.json").read_text()) if (directory / "cell.json").exists()
            else train_cell(recipe, grpo, recipe.ablation.arms[arm_index].name, seed))
    for protocol in recipe.ablation.protocols:
        if not plays(protocol, recipe.ablation.arms[arm_index].name):
            continue
        pipeline = protocol_pipeline(recipe, protocol)
        for evaluation in played(protocol, cell["evaluations"]):
            name = Path(evaluation["eval_dir"]).name
            evaluate(pipeline.eval_config(directory / "checkpoints" / name, directory / eval_dirname(protocol) / name),
                     progress=False)
    return cell


def train_cell(recipe, grpo, arm: str, seed: int) -> dict:
    """One cell's GRPO run and its checkpoints' evaluations with the recipe's protocol, as cell.json."""
    pipeline = Pipeline(recipe)
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
    cell = {"arm": arm, "seed": seed, "grpo_seed": grpo.grpo.seed,
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


def check_ablation(recipe: AblationRecipe) -> None:
    ablation = recipe.ablation
    if not ablation.arms:
        raise ValueError("ablation.arms is empty; list the GRPO arms to compare (name + overrides)")
    names = [arm.name for arm in ablation.arms]
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_-]+", n) or n == "eval" or n.startswith("eval_")]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"ablation arm names must be unique directory names ([A-Za-z0-9_-]) other than 'eval' "
                         f"and 'eval_*' (the evaluations' directories); got {names}")
    protocol_names = [p.name for p in ablation.protocols]
    if any(not re.fullmatch(r"[A-Za-z0-9_-]+", n) for n in protocol_names) or len(set(protocol_names)) != len(
            protocol_names):
        raise ValueError(f"ablation protocol names must be unique directory names ([A-Za-z0-9_-]); got "
                         f"{protocol_names}")
    for protocol in ablation.protocols:  # the others are compared with the first arm: it plays every protocol
        unknown = [a for a in protocol.arms if a not in names]
        if unknown or (protocol.arms and names[0] not in protocol.arms):
            raise ValueError(f"ablation protocol {protocol.name!r} plays arms {protocol.arms}: expected names of "
                             f"ablation.arms {names}, the first ({names[0]!r}, the others' comparison) among them"
                             + (f"; unknown: {unknown}" if unknown else ""))
    if ablation.guard_protocol and ablation.guard_protocol not in protocol_names:
        raise ValueError(f"ablation.guard_protocol {ablation.guard_protocol!r} is not one of ablation.protocols "
                         f"{protocol_names}: the guard chooses on a further protocol's episodes")
    for protocol in ablation.protocols:  # every protocol's overrides name real eval keys with valid values
        protocol_config(recipe, protocol).check(f"ablation protocol {protocol.name!r}")
    if ablation.guard_protocol:  # the guard chooses on episodes the held-out judgement never plays
        guard = guard_of(recipe)
        held_out, chosen_on = protocol_config(recipe, None), protocol_config(recipe, guard)
        if shares_states(held_out, chosen_on):
            raise ValueError(f"ablation.guard_protocol {guard.name!r} plays {chosen_on.init_states} init states "
                             f"{trial_range(chosen_on)} and the held-out protocol plays some of them "
                             f"({trial_range(held_out)}): a guard that chooses on the episodes that judge its choice "
                             "flatters it; give it eval.init_states=validation (or other trials)")
    for i, arm in enumerate(ablation.arms):
        seeds = arm_seeds(ablation, arm)
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError(f"ablation arm {arm.name!r}: seeds must be distinct and non-empty, got {seeds}")
        stride = 0 if ablation.paired_seeds else SEED_STRIDE * i
        bad = [s for s in seeds if not 0 <= s < SEED_LIMIT - stride]
        if bad:
            raise ValueError(f"ablation arm {arm.name!r}: seeds {bad} out of range; expected 0 <= seed < "
                             f"{SEED_LIMIT - stride} (its GRPO seed, seed + {stride}, must be < 2**32)")
        # set by the ablation (out, seed) or the pipeline (the start and the tasks): an arm that set one
        # would silently run with the ablation's value instead
        refused = connected_keys_set(arm.overrides)
        if refused:
            raise ValueError(f"ablation arm {arm.name!r} overrides {refused}: the ablation sets these for every "
                             f"cell ({', '.join(CONNECTED_GRPO_KEYS)}); use ablation.seeds, or change them in the "
                             "recipe for all arms")
    check_config(ablation, "ablation")
    for i, arm in enumerate(ablation.arms):  # every arm's overrides name real keys with valid values, before any work
        validate(cell_recipe(recipe, i, arm_seeds(ablation, arm)[0]))
    for i, arm in enumerate(ablation.arms):  # a finished cell is reused only if it ran the settings asked for now
        for seed in arm_seeds(ablation, arm):
            directory = cell_dir(recipe, arm.name, seed)
            if (directory / "cell.json").exists():
                saved = read_json(directory / "recipe.json", "the cell's GRPO recipe")
                changed = recipe_differences(saved, asdict(cell_recipe(recipe, i, seed)), CELL_MAY_DIFFER,
                                             asdict(GRPORecipe()))
                if changed:
                    raise ValueError(f"ablation cell {directory} finished with other settings than the recipe's now: "
                                     f"{'; '.join(changed)}; restore them, or delete the cell to run it again")


def run_ablation(recipe: AblationRecipe, parallel: int = 1) -> dict:
    """Stages demos…wm (finished ones kept), the SFT evaluation, every cell, then the report."""
    pipeline = Pipeline(recipe)  # fills in the SFT checkpoint and world model every cell starts from
    check_ablation(recipe)
    if parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {parallel}")
    out = check_output_dir(Path(recipe.out) / "ablation", "ablate")
    start = time.perf_counter()
    pipeline.run(("demos", "vq", "sft", "wm"), skip_finished=True)
    create_output_dir(out, "ablate")
    for protocol in protocols(recipe):
        evals = out / eval_dirname(protocol)
        if protocol is None:
            evaluate(pipeline.eval_config(Path(recipe.out) / "sft" / "final", evals / "sft"))
            continue
        create_output_dir(evals, "ablate")  # the protocol's report goes beside its SFT evaluation
        try:
            evaluate(protocol_pipeline(recipe, protocol).eval_config(Path(recipe.out) / "sft" / "final", evals / "sft"))
        except SettingsChanged as error:
            raise ValueError(f"ablation protocol {protocol.name!r} was evaluated with other settings than its "
                             f"overrides give now ({error}); restore them, name the protocol anew, or delete "
                             f"{evals} and the cells' {eval_dirname(protocol)}/ to evaluate it again") from None
    ablation = recipe.ablation
    todo = [(i, s) for i, arm in enumerate(ablation.arms) for s in arm_seeds(ablation, arm)
            if not (cell_dir(recipe, arm.name, s) / "cell.json").exists()
            or unevaluated(recipe, arm.name, cell_dir(recipe, arm.name, s))]
    data = asdict(recipe)
    if parallel == 1:
        for i, s in todo:
            print(f"== ablation cell: arm {ablation.arms[i].name}, seed {s}", flush=True)
            run_cell(data, i, s)
    else:
        with ProcessPoolExecutor(parallel, mp_context=get_context("spawn")) as pool:
            for future in [pool.submit(run_cell, data, i, s) for i, s in todo]:
                future.result()
    wall_s = time.perf_counter() - start
    evidence = {None if p is None else p.name: collect_evidence(recipe, p) for p in protocols(recipe)}
    for protocol in judged_with_guard(recipe):
        evidence[None if protocol is None else protocol.name]["guard"] = guard_evidence(
            evidence[ablation.guard_protocol], ablation.guard_p)
    reports = {}
    for protocol in protocols(recipe):
        report = summarize_ablation(evidence[None if protocol is None else protocol.name])
        report["wall_s_this_invocation"] = wall_s
        write_report(report, out if protocol is None else out / eval_dirname(protocol))
        reports[None if protocol is None else protocol.name] = report
    return reports[None] | {"protocols": {name: r for name, r in reports.items() if name is not None}}


def write_report(report: dict, out: Path) -> None:
    """`ablation.json` (the report, with every seed's episodes), `ablation.md` and `ablation.png`."""
    create_output_dir(out, "ablate")
    with atomic_file(out / "ablation.json") as tmp:
        tmp.write_text(json.dumps(report, indent=2))
    with atomic_file(out / "ablation.md") as tmp:
        tmp.write_text(ablation_table(report))
    plot_ablation(report, out / "ablation.png")
    print(ablation_table(report))


def _read_cell(directory: Path, protocol: Protocol | None) -> dict:
    """A finished cell, each evaluation's success and episodes read from the protocol's evaluation on
    disk (the episodes the paired comparisons use), not from the copy in cell.json."""
    cell = json.loads((directory / "cell.json").read_text())
    cell["evaluations"] = played(protocol, cell["evaluations"])
    cell["replay_real_steps"] = gate_replay_real_steps(directory)
    for evaluation in cell["evaluations"]:  # where the cell directory is now, whatever the working directory
        eval_dir = directory / eval_dirname(protocol) / Path(evaluation.pop("eval_dir")).name
        evaluation["success"] = json.loads((eval_dir / "eval_info.json").read_text())["overall"]
        evaluation["settings"], results = load_evaluation(eval_dir)
        evaluation["episodes"] = _episode_rows(results)
    return cell


def _episode_rows(results: dict) -> list[list]:
    """Success by (task, trial, sample) as JSON rows `[task, trial, sample, 0|1]`."""
    return [[task, trial, sample, int(success)] for (task, trial, sample), success in sorted(results.items())]


def _by_state(rows: list[list]) -> dict:
    """`compare.by_state` of episode rows: the init state is the unit resampled."""
    return by_state({(task, trial, sample): bool(success) for task, trial, sample, success in rows})


def collect_evidence(recipe, protocol: Protocol | None = None) -> dict:
    """Everything the report is computed from, as JSON: the SFT evaluation's episodes and, per arm
    and seed, each evaluated checkpoint's episodes (under `protocol`), real-simulator use and
    training metrics."""
    ablation = recipe.ablation
    sft_eval = Path(recipe.out) / "ablation" / eval_dirname(protocol) / "sft"
    sft_settings, sft_results = load_evaluation(sft_eval)
    arms = []
    for arm in [arm for arm in ablation.arms if plays(protocol, arm.name)]:
        cells = [_read_cell(cell_dir(recipe, arm.name, s), protocol) for s in arm_seeds(ablation, arm)]
        for cell in cells:
            for evaluation in cell["evaluations"]:
                check_comparable(sft_settings, evaluation.pop("settings"), str(sft_eval),
                                 f"{arm.name} seed {cell['seed']} step {evaluation['step']}")
        arms.append({"arm": arm.name, "overrides": arm.overrides, "cells": cells})
    return {"eval_settings": sft_settings,
            "sft": {"overall": json.loads((sft_eval / "eval_info.json").read_text())["overall"],
                    "episodes": _episode_rows(sft_results)},
            "arms": arms, "first_arm": ablation.arms[0].name,
            "final_only": protocol is not None and protocol.final_only, "budget_ratio": ablation.budget_ratio,
            "seeding": "paired: every arm uses the same GRPO seeds" if ablation.paired_seeds else
                       f"independent: arm i uses GRPO seed s + {SEED_STRIDE} × i",
            "grpo": {k: v for k, v in asdict(recipe.grpo.grpo).items() if k != "seed"},
            "versions": run_versions()}


def guard_evidence(protocol_evidence: dict, accept_p: float) -> dict:
    """What the after-the-fact guard chooses from: the guard protocol's SFT episodes and each seed's
    final-checkpoint episodes under it."""
    return {"protocol": protocol_evidence["eval_settings"], "accept_p": accept_p,
            "sft": protocol_evidence["sft"]["episodes"],
            "arms": {entry["arm"]: [c["evaluations"][-1]["episodes"] for c in entry["cells"]]
                     for entry in protocol_evidence["arms"]},
            "seeds": {entry["arm"]: [c["seed"] for c in entry["cells"]] for entry in protocol_evidence["arms"]}}


def guarded_arms(guard: dict, sft: dict, finals: dict[str, list[dict]], seeds: dict[str, list[int]]) -> list[dict]:
    """Per arm, each seed's checkpoint chosen by the validation guard's rule (`ValidationTracker`) on
    the guard protocol's episodes, SFT's or its final, and that choice judged on the held-out episodes
    (`sft`, `finals`: by state, the report's protocol; `seeds`: each arm's, in the order of `finals`)."""
    start = _by_state(guard["sft"])
    rows = []
    for arm, checks in guard["arms"].items():
        if arm not in seeds:  # an arm the judged protocol does not play
            continue
        if guard["seeds"][arm] != seeds[arm]:
            raise ValueError(f"the guard's evidence for arm {arm!r} holds seeds {guard['seeds'][arm]}, the held-out "
                             f"evidence {seeds[arm]}: they must be the same cells")
        kept = []
        for episodes in checks:
            tracker = ValidationTracker(ValidationConfig(accept_p=guard["accept_p"], early_stop=False))
            tracker.update(0, start)
            kept.append(tracker.update(1, _by_state(episodes))["val_improved"])
        chosen = [final if keep else sft for final, keep in zip(finals[arm], kept)]
        per_seed = _success_rates(chosen)
        rows.append({"arm": arm, "kept": kept, "held_out_per_seed": per_seed,
                     "held_out": mean_interval(per_seed, bounds=RATE_BOUNDS),
                     "vs_sft": seed_level_difference([sft] * len(chosen), chosen)})
    return rows


def _success_rates(chosen: list[dict]) -> list[float]:
    """Each seed's held-out success from its chosen checkpoint's episodes (by state)."""
    return [float(np.mean(list(episodes.values()))) for episodes in chosen]


def summarize_ablation(evidence: dict) -> dict:
    """Per arm, from the evidence alone (so anyone can recompute it from the JSON): held-out success
    per seed and over seeds, seed-level paired differences to SFT and to the first arm (the training
    seed as the unit; McNemar per seed only), agreement with SFT, real-simulator use and the
    real steps to reach the first arm's final success, with an interval over seeds."""
    sft = _by_state(evidence["sft"]["episodes"])
    finals: dict[str, list[dict]] = {}
    arms = []
    for entry in evidence["arms"]:
        cells = entry["cells"]
        final = [_by_state(c["evaluations"][-1]["episodes"]) for c in cells]
        finals[entry["arm"]] = final
        per_seed = [c["evaluations"][-1]["success"]["success_rate"] for c in cells]
        arms.append({
            "arm": entry["arm"], "overrides": entry["overrides"], "seeds": [c["seed"] for c in cells],
            "grpo_seeds": [c["grpo_seed"] for c in cells],
            "held_out_per_seed": per_seed, "held_out": mean_interval(per_seed, bounds=RATE_BOUNDS),
            "held_out_pooled": rate(sum(sum(f.values()) for f in final), sum(len(f) for f in final)),
            "vs_sft": seed_level_difference([sft] * len(final), final),
            "identical_to_sft": sum(f[k] == sft[k] for f in final for k in f),
            "episodes": sum(len(f) for f in final),
            "train_success_first": mean_interval([c["train_success_first"] for c in cells], bounds=RATE_BOUNDS),
            "train_success_last3": mean_interval([c["train_success_mean_last3"] for c in cells], bounds=RATE_BOUNDS),
            "grpo_steps": [c["grpo_steps"] for c in cells],
            "real_steps": mean_interval([c["real_steps"] for c in cells]),
            "real_episodes": mean_interval([c["real_episodes"] for c in cells]),
            "real_steps_per_grpo_step": float(np.mean([c["real_steps"] / c["grpo_steps"] for c in cells])),
            # rollouts cut before their end (at the horizon, or by the gate), of all the arm ran
            "cut_share": float(np.mean([c.get("truncated_episodes", 0) / c["real_episodes"] for c in cells])),
            "calibration_auroc": _auroc_over_seeds(cells),
            # what the episodes its gate started from cost (evidence written before it was recorded: none)
            "replay_real_steps": [c.get("replay_real_steps", 0) for c in cells],
            "wall_s": mean_interval([c["wall_s"] for c in cells]),
            "curve": _curve(cells), "seed_curves": [_seed_curve(c) for c in cells],
        })
    first = evidence["first_arm"]
    sft_success = evidence["sft"]["overall"]["success_rate"]
    target = arms[0]["curve"][-1]["success"]["mean"]  # the first arm's final held-out success
    first_needs, _ = steps_to_reach(arms[0]["curve"], sft_success, target)
    first_charge = float(np.mean(arms[0]["replay_real_steps"]))  # the first arm's gate replay, when charged
    for entry in arms:
        if evidence.get("final_only", False):  # one point per seed: a straight line from SFT would be no measurement
            entry.update(steps_to_first_arm_final=None, steps_interpolated=False, real_step_ratio=None,
                         real_step_ratio_interval=None)
            continue
        needs, interpolated = steps_to_reach(entry["curve"], sft_success, target)
        entry["steps_to_first_arm_final"], entry["steps_interpolated"] = needs, interpolated
        entry["real_step_ratio"] = first_needs / needs if needs and first_needs is not None else None
        entry["real_step_ratio_interval"] = real_step_ratio_interval(arms[0]["seed_curves"], entry["seed_curves"],
                                                                     sft_success)
        # the same, each gate's replay charged to its arm, the first arm's included (as a first run pays)
        if any(entry["replay_real_steps"]) or any(arms[0]["replay_real_steps"]):
            charge = float(np.mean(entry["replay_real_steps"]))
            entry["charged_ratio"] = {
                "steps_to_first_arm_final": None if needs is None else needs + charge,
                "real_step_ratio": (None if needs is None or first_needs is None or needs + charge == 0
                                    else (first_needs + first_charge) / (needs + charge)),
                "interval": real_step_ratio_interval(arms[0]["seed_curves"], entry["seed_curves"], sft_success,
                                                     charges=entry["replay_real_steps"],
                                                     first_charges=arms[0]["replay_real_steps"])}
    for entry in arms[1:]:  # on the seed indices both arms ran
        shared = min(len(finals[first]), len(finals[entry["arm"]]))
        entry["vs_first_arm"] = seed_level_difference(finals[first][:shared], finals[entry["arm"]][:shared])
        entry["seeds_to_settle"] = seeds_for_half_width(entry["vs_first_arm"])
    report = {"sft": evidence["sft"]["overall"], "eval_settings": evidence["eval_settings"], "arms": arms,
              "first_arm": first, "seeding": evidence["seeding"], "grpo": evidence["grpo"],
              "statistics_unit": SEED_LEVEL_UNIT, "evidence": evidence}
    ratio = evidence.get("budget_ratio", 0)  # evidence written before the setting existed: no budget rows
    if ratio and not evidence.get("final_only", False):
        budget = arms[0]["real_steps"]["mean"] / ratio
        report["budget"] = {"ratio": ratio, "real_steps": budget}
        # charged: the budget grows by the first arm's replay and each seed's own replay is spent before step 1
        for entry, cells in zip(arms[1:], [e["cells"] for e in evidence["arms"][1:]]):
            entry["at_budget"] = within_budget(cells, budget, sft, finals[first])
            if "charged_ratio" in entry:
                entry["at_budget_charged"] = within_budget(cells, budget + first_charge / ratio, sft, finals[first],
                                                           charges=entry["replay_real_steps"])
    if "guard" in evidence:
        report["guarded"] = guarded_arms(evidence["guard"], sft, finals, {a["arm"]: a["seeds"] for a in arms})
    return report


def within_budget(cells: list[dict], budget: float, sft: dict, first_finals: list[dict],
                  charges: list[float] | None = None) -> dict:
    """Each seed's last evaluated checkpoint whose cumulative real steps are within `budget` (SFT's
    episodes where none is: all the run had to show at that cost) and its seed-level difference to the
    first arm's finals (`sft`, `first_finals`: by state). A rule fixed in advance, not the checkpoint
    that happened to score best, so the comparison is not flattered by selection. `charges`: real steps
    each seed spent before its first GRPO step (its gate's replay), counted against the budget."""
    steps, real_steps, chosen = [], [], []
    for cell, charge in zip(cells, charges or [0.0] * len(cells)):
        within = [e for e in cell["evaluations"] if e["real_steps"] + charge <= budget]
        steps.append(within[-1]["step"] if within else 0)
        real_steps.append(within[-1]["real_steps"] if within else 0)
        chosen.append(_by_state(within[-1]["episodes"]) if within else sft)
    per_seed = _success_rates(chosen)
    shared = min(len(first_finals), len(chosen))
    return {"steps": steps, "real_steps": real_steps, "held_out_per_seed": per_seed,
            "held_out": mean_interval(per_seed, bounds=RATE_BOUNDS),
            "vs_first_arm": seed_level_difference(first_finals[:shared], chosen[:shared])}


def _auroc_over_seeds(cells: list[dict]) -> dict | None:
    aurocs = [c["calibration_auroc"] for c in cells
              if c.get("calibration_auroc") is not None and np.isfinite(c["calibration_auroc"])]
    return mean_interval(aurocs) if aurocs else None


def _seed_curve(cell: dict) -> list[tuple[float, float]]:
    """(cumulative real steps, held-out success) of one seed's evaluated checkpoints."""
    return [(e["real_steps"], e["success"]["success_rate"]) for e in cell["evaluations"]]


def _curve(cells: list[dict]) -> list[dict]:
    """Held-out success against cumulative real steps: mean over seeds at each evaluated GRPO step."""
    steps = sorted({e["step"] for c in cells for e in c["evaluations"]})
    curve = []
    for step in steps:
        points = [e for c in cells for e in c["evaluations"] if e["step"] == step]
        curve.append({"step": step, "seeds": len(points),
                      "real_steps": float(np.mean([p["real_steps"] for p in points])),
                      "success": mean_interval([p["success"]["success_rate"] for p in points], bounds=RATE_BOUNDS)})
    return curve


def steps_to_reach(curve: list[dict], sft_success: float, target: float) -> tuple[float | None, bool]:
    """Cumulative real-simulator steps at which the mean held-out success curve (starting from the
    SFT checkpoint at 0 steps) first reaches `target`, interpolated linearly between evaluated
    checkpoints (SFT included); None if it never does. Also whether that was interpolated (the
    target reached between two evaluated points, not at one)."""
    points = [(0.0, sft_success)] + [(p["real_steps"], p["success"]["mean"]) for p in curve]
    if sft_success >= target:
        return 0.0, False
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if y1 >= target:  # y0 < target <= y1
            return x0 + (x1 - x0) * (target - y0) / (y1 - y0), y1 > target
    return None, False


def real_step_ratio_interval(first: list[list], arm: list[list], sft_success: float, resamples: int = 2000,
                             seed: int = 0, charges: list[float] | None = None,
                             first_charges: list[float] | None = None) -> dict | None:
    """Percentile interval of the real-step ratio with seeds resampled (each arm's independently):
    the first arm's steps to reach its own final mean success over this arm's steps to reach it,
    among the resamples in which the arm reached it at all (their share is returned too; the interval
    is None when fewer than `MIN_RATIOS` did). None with one seed in either. `charges`: real steps
    added to each of the arm's seeds (before its first step: the episodes its gate started from);
    `first_charges`: the same for the first arm's seeds."""
    if len(first) < 2 or len(arm) < 2 or any(len(c) != len(first[0]) for c in first) \
            or any(len(c) != len(arm[0]) for c in arm):
        return None
    rng = np.random.default_rng(seed)
    first, arm = np.asarray(first, float), np.asarray(arm, float)  # (seeds, points, [real steps, success])
    charges = np.zeros(len(arm)) if charges is None else np.asarray(charges, float)
    first_charges = np.zeros(len(first)) if first_charges is None else np.asarray(first_charges, float)
    ratios, reached = [], 0
    for _ in range(resamples):
        drawn_first = rng.integers(len(first), size=len(first))
        mean_first, first_charge = first[drawn_first].mean(axis=0), first_charges[drawn_first].mean()
        drawn = rng.integers(len(arm), size=len(arm))
        mean_arm, charge = arm[drawn].mean(axis=0), charges[drawn].mean()
        target = mean_first[-1, 1]
        curve = [{"real_steps": x, "success": {"mean": y}} for x, y in mean_first]
        first_needs, _ = steps_to_reach(curve, sft_success, target)
        needs, _ = steps_to_reach([{"real_steps": x, "success": {"mean": y}} for x, y in mean_arm], sft_success,
                                  target)
        if needs is not None:
            reached += 1
            if needs + charge > 0:
                ratios.append((first_needs + first_charge) / (needs + charge))
    if len(ratios) < MIN_RATIOS:
        return {"ci95": None, "reached_share": reached / resamples}
    return {"ci95": [float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))],
            "reached_share": reached / resamples}


def _pct(interval) -> str:
    return "n/a" if interval is None else f"[{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"


def _seed_level(d: dict) -> str:
    """A seed-level difference: points, interval, p (t over seeds) and the sign-flip p; one seed: n/a."""
    if d["ci95"] is None:
        return f"{100 * d['difference']:+.1f} n/a (1 seed)"
    sign_flip = "" if d["p_sign_flip"] is None else f", sign-flip p={d['p_sign_flip']:.2g}"
    return f"{100 * d['difference']:+.1f} {_pct(d['ci95'])}, p={d['p']:.2g}{sign_flip}"


def _per_seed_mcnemar(d: dict) -> str:
    return "; ".join(f"+{s['gained']}/−{s['lost']} p={s['p_mcnemar']:.2g}" for s in d["per_seed"])


def ablation_table(report: dict) -> str:
    s, sft = report["eval_settings"], report["sft"]
    first_arm = report["first_arm"]
    lines = [f"# Ablation: held-out success ({s['suite']} tasks {s['tasks']}, init states {s['first_trial']}.."
             f"{s['first_trial'] + s['trials'] - 1}, {s['samples_per_state']} sample(s) each, {s['sampling']}, "
             f"cap {s['max_steps']})", "",
             f"SFT: {sft['successes']}/{sft['trials']} = {100 * sft['success_rate']:.1f}% "
             f"{_pct(sft['ci95'])} (Wilson). "
             f"Seeds: {report['seeding']}.", "",
             "| arm | held-out success, mean over seeds [95% t] | per seed | vs SFT, seed-level [95% CI] | "
             f"vs {first_arm}, seed-level [95% CI] | same as SFT | training success first → last 3 | "
             "real episodes | real steps | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in report["arms"]:
        first = arm.get("vs_first_arm")
        lines.append(
            f"| {arm['arm']} | {100 * arm['held_out']['mean']:.1f}% {_pct(arm['held_out']['ci95'])} | "
            + ", ".join(f"{100 * x:.0f}%" for x in arm["held_out_per_seed"])
            + f" | {_seed_level(arm['vs_sft'])} | {'-' if first is None else _seed_level(first)} | "
            f"{arm['identical_to_sft']}/{arm['episodes']} | "
            f"{100 * arm['train_success_first']['mean']:.0f}% → {100 * arm['train_success_last3']['mean']:.0f}% | "
            f"{arm['real_episodes']['mean']:.0f} | {arm['real_steps']['mean']:.0f} | {arm['wall_s']['mean']:.0f} |")
    lines += ["", "Seed-level differences treat the training seed as the unit: each seed's final checkpoint against "
              f"the SFT checkpoint (or the {first_arm} checkpoint of the same seed index) on the same init states and "
              f"sampling seeds; random in the interval: {report['statistics_unit']}. p: Student's t with the same "
              "standard error; sign-flip p: exact, over the per-seed differences (with n seeds it cannot go below "
              "2/2^n). Success intervals are clipped to [0, 100].", "",
              "Per seed, its checkpoint against SFT (exact McNemar on the discordant episodes: valid for one "
              "checkpoint against one):", ""]
    lines += [f"- {arm['arm']}: {_per_seed_mcnemar(arm['vs_sft'])}" for arm in report["arms"]]
    lines += ["", f"Seeds a side that a ±{100 * PLANNING_HALF_WIDTH:g}-point seed-level interval against {first_arm} "
              "would take at the spread these seeds show (standard error falling as 1/√seeds; a planning figure, not "
              "an inference):", ""]
    lines += [f"- {arm['arm']}: {'n/a' if arm['seeds_to_settle'] is None else arm['seeds_to_settle']} "
              f"({arm['vs_first_arm']['seeds']} run)" for arm in report["arms"][1:]]
    if "guarded" in report:
        g = report["evidence"]["guard"]
        lines += ["", f"Guarded: GRPO's validation guard after the fact. On the guard protocol's episodes "
                  f"({g['protocol']['init_states']} init states {g['protocol']['first_trial']}.."
                  f"{g['protocol']['first_trial'] + g['protocol']['trials'] - 1}, {g['protocol']['sampling']}) "
                  f"a seed keeps its final checkpoint only where it beat SFT (exact McNemar p <= {g['accept_p']}), "
                  "else SFT's; that choice judged on the held-out episodes above.", "",
                  "| arm, guarded | final kept | held-out success, mean over seeds [95% t] | per seed | "
                  "vs SFT, seed-level [95% CI] |", "|---|---|---|---|---|"]
        lines += [f"| {row['arm']} | {sum(row['kept'])}/{len(row['kept'])} | {100 * row['held_out']['mean']:.1f}% "
                  f"{_pct(row['held_out']['ci95'])} | " + ", ".join(f"{100 * x:.0f}%" for x in row["held_out_per_seed"])
                  + f" | {_seed_level(row['vs_sft'])} |" for row in report["guarded"]]
    lines += ["", f"Real-simulator cost, measured: steps the envs executed. Ratio: real steps {first_arm} needs to "
              f"reach its final held-out success over the steps the arm needs to reach it (mean curves, linear between "
              "evaluated checkpoints, SFT at 0 steps; > 1: cheaper); its interval resamples each arm's seeds "
              "(percentile), with the share of resamples in which the arm reached the target.", "",
              f"| arm | real steps per GRPO step (× fewer than {first_arm}) | rollouts cut | "
              "world-model AUROC on calibration pairs | "
              f"real steps to reach {first_arm}'s final success | ratio [95% over seeds] |",
              "|---|---|---|---|---|---|"]
    per_step_first = report["arms"][0]["real_steps_per_grpo_step"]
    unreached = "final checkpoints only" if report["evidence"].get("final_only", False) else "not reached"
    starred = False
    for arm in report["arms"]:
        needs, ratio, star = arm["steps_to_first_arm_final"], arm["real_step_ratio"], arm["steps_interpolated"]
        starred |= star
        mark = " *" if star else ""
        auroc = arm.get("calibration_auroc")
        auroc_text = "-" if auroc is None else f"{auroc['mean']:.2f}" + (
            "" if auroc["ci95"] is None else f" [{auroc['ci95'][0]:.2f}, {auroc['ci95'][1]:.2f}]")
        spread = arm.get("real_step_ratio_interval")
        spread_text = ""
        if spread is not None:
            interval = "" if spread["ci95"] is None else f" [{spread['ci95'][0]:.2f}, {spread['ci95'][1]:.2f}]"
            spread_text = f"{interval}, reached in {100 * spread['reached_share']:.1f}%"
        lines.append(f"| {arm['arm']} | {arm['real_steps_per_grpo_step']:.0f} "
                     f"({per_step_first / arm['real_steps_per_grpo_step']:.2f}×) | "
                     f"{100 * arm['cut_share']:.0f}% | "
                     f"{auroc_text} | "
                     f"{unreached if needs is None else f'{needs:.0f}'}{mark} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'}{mark}{spread_text} |")
    if starred:
        lines += ["", "\\* interpolated on a straight line between the two evaluated points around the crossing (SFT "
                  "counts as one, at 0 steps): not a measurement of when the success was reached; set "
                  "`ablation.eval_every` for more evaluated checkpoints."]
    charged = [arm for arm in report["arms"] if arm.get("charged_ratio")]
    if charged:
        lines += ["", "The same with the episodes each gate started from (`gate.replay`: the wm stage's collection, "
                  f"earlier runs) charged to its arm, {first_arm}'s too, as a first gated run on the task pays them:",
                  ""]
    for arm in charged:
        c, spread = arm["charged_ratio"], arm["charged_ratio"]["interval"]
        reached = "not reached" if c["real_step_ratio"] is None else (
            f"{first_arm}'s final reached at {c['steps_to_first_arm_final']:.0f}: {c['real_step_ratio']:.2f}x")
        interval = "" if spread is None else "" if spread["ci95"] is None else (
            f" [{spread['ci95'][0]:.2f}, {spread['ci95'][1]:.2f}]")
        interval += "" if spread is None else f", reached in {100 * spread['reached_share']:.1f}% of seed resamples"
        lines.append(f"- {arm['arm']}: {np.mean(arm['replay_real_steps']):.0f} real steps per seed before its first "
                     f"GRPO step; {reached}{interval}")
    if "budget" in report:
        budget = report["budget"]
        lines += ["", f"At a fixed real-execution cost: {first_arm}'s mean real steps / {budget['ratio']:g} = "
                  f"{budget['real_steps']:.0f}. Each seed's last evaluated checkpoint within it (SFT where none is: "
                  f"GRPO step 0) against {first_arm}'s final of the same seed index: non-inferiority at "
                  f"{budget['ratio']:g}× fewer real steps. Replays charged: the budget also holds {first_arm}'s "
                  "gate replay / the ratio, and each seed's own replay is spent from it before its first step "
                  "(real steps, mean: the checkpoint's, without it).", "",
                  "| arm | GRPO step per seed | real steps, mean | held-out success, mean over seeds [95% t] | "
                  f"per seed | vs {first_arm}'s final, seed-level [95% CI] |", "|---|---|---|---|---|---|"]
        for arm in report["arms"][1:]:
            for name, within in ((arm["arm"], arm["at_budget"]),
                                 (f"{arm['arm']}, replays charged", arm.get("at_budget_charged"))):
                if within is None:
                    continue
                lines.append(f"| {name} | {', '.join(str(s) for s in within['steps'])} | "
                             f"{np.mean(within['real_steps']):.0f} | {100 * within['held_out']['mean']:.1f}% "
                             f"{_pct(within['held_out']['ci95'])} | "
                             + ", ".join(f"{100 * x:.0f}%" for x in within["held_out_per_seed"])
                             + f" | {_seed_level(within['vs_first_arm'])} |")
    return "\n".join(lines) + "\n"


def evidence_from_json(path: Path) -> dict:
    """A written `ablation.json`'s evidence (every seed's episodes)."""
    data = read_json(Path(path), "the ablation report")
    if "evidence" not in data:
        raise ValueError(f"{path} holds no 'evidence' (per-seed episodes); it was written before reports kept "
                         "them: re-run `minivla-wmrl ablate` on its recipe to rewrite it")
    return data["evidence"]


def report_from_json(path: Path) -> dict:
    """The report recomputed from a written `ablation.json`'s evidence."""
    return summarize_ablation(evidence_from_json(path))


def against(evidence: dict, arm: str) -> dict:
    """The evidence with `arm` first: every other arm's differences, real-step ratio and budget are then
    taken against it (e.g. the gate against a time-only gate, instead of against sparse)."""
    names = [entry["arm"] for entry in evidence["arms"]]
    if arm not in names:
        raise ValueError(f"ablate --against {arm!r}: the report has no such arm; its arms are {names}")
    return dict(evidence, arms=sorted(evidence["arms"], key=lambda entry: entry["arm"] != arm), first_arm=arm,
                seeding=f"{evidence['seeding']} (i: the arm's place in the ablation: {', '.join(names)})")


def _outcomes(cell: dict) -> tuple:
    """What a cell run again must repeat: its training and every evaluation's episodes, not its timings."""
    training = ("grpo_seed", "real_steps", "real_episodes", "grpo_steps", "train_success_last")
    return (tuple(cell.get(k) for k in training),
            [(e["step"], e["real_steps"], e["real_episodes"], e["episodes"]) for e in cell["evaluations"]])


def merge_evidence(named: list[tuple[str, dict]]) -> dict:
    """One ablation's evidence from several invocations that each ran some of its cells (e.g. sessions
    whose run directories did not survive): the same SFT checkpoint (by sha256), protocol, GRPO
    settings and seeding in each; every arm's cells pooled by seed. A cell present in more than one
    must have repeated exactly (a run repeats bit for bit on the same versions and thread count), a
    check that the invocations reproduce each other. Guard evidence is pooled where every report has it."""
    (first_name, first), rest = named[0], named[1:]
    same = {"eval_settings": lambda e: {k: v for k, v in e["eval_settings"].items() if k != "checkpoint"},
            "SFT episodes": lambda e: e["sft"]["episodes"], "grpo settings": _grpo_settings,
            "seeding": lambda e: e["seeding"], "first arm": lambda e: e["first_arm"],
            "checkpoints played (final_only)": lambda e: e.get("final_only", False)}
    for name, evidence in rest:
        for what, get in same.items():
            if get(evidence) != get(first):
                raise ValueError(f"ablate --merge: {name} and {first_name} differ in {what}; only invocations of one "
                                 "ablation (same SFT checkpoint, protocol and GRPO settings) merge")
    arms: dict[str, dict] = {}
    for name, evidence in named:
        for entry in evidence["arms"]:
            arm = arms.setdefault(entry["arm"], {"arm": entry["arm"], "overrides": entry["overrides"], "cells": {}})
            if entry["overrides"] != arm["overrides"]:
                raise ValueError(f"ablate --merge: arm {entry['arm']!r} has overrides {entry['overrides']} in {name} "
                                 f"and {arm['overrides']} in another report")
            for cell in entry["cells"]:
                _merge_cell(arm["cells"], cell["seed"], cell, f"arm {entry['arm']!r} seed {cell['seed']}", name,
                            lambda a, b: _outcomes(a) == _outcomes(b))
    merged = dict(first, grpo=_grpo_settings(first),
                  arms=[dict(a, cells=[a["cells"][s] for s in sorted(a["cells"])]) for a in arms.values()])
    merged["merged_from"] = [{"report": name, "seeds": {e["arm"]: [c["seed"] for c in e["cells"]] for e in ev["arms"]},
                              "versions": ev["versions"]} for name, ev in named]
    merged.pop("guard", None)
    guards = [(name, e["guard"]) for name, e in named if "guard" in e]
    if len(guards) == len(named):
        merged["guard"] = _merge_guard(guards)
    return merged


def _grpo_settings(evidence: dict) -> dict:
    """A report's GRPO settings, a field it predates read as its default: every field added to GRPOConfig
    defaults to the behaviour before it (e.g. `oracle_cut_steps=0`, off), so an older report ran with it
    (`recipe_differences`' rule for a resumed run; here symmetric, either report may be the older)."""
    return {**{k: v for k, v in asdict(GRPOConfig()).items() if k != "seed"}, **evidence["grpo"]}


def _merge_cell(cells: dict, seed: int, value, what: str, source: str, repeats) -> None:
    if seed in cells and not repeats(cells[seed], value):
        raise ValueError(f"ablate --merge: {what} in {source} did not repeat the same cell of an earlier report "
                         "(other episodes or training); the runs differ (versions, thread count?) and do not merge")
    cells.setdefault(seed, value)


def _merge_guard(guards: list[tuple[str, dict]]) -> dict:
    """The guard evidence of several reports, pooled by arm and seed (same protocol, level and SFT episodes)."""
    (first_name, first) = guards[0]
    for name, guard in guards[1:]:
        if [guard[k] for k in ("protocol", "accept_p", "sft")] != [first[k] for k in ("protocol", "accept_p", "sft")]:
            raise ValueError(f"ablate --merge: the guard evidence of {name} and {first_name} differs in protocol, "
                             "level or SFT episodes")
    by_arm: dict[str, dict] = {}
    for name, guard in guards:
        for arm, seeds in guard["seeds"].items():
            for seed, episodes in zip(seeds, guard["arms"][arm]):
                _merge_cell(by_arm.setdefault(arm, {}), seed, episodes, f"the guard's arm {arm!r} seed {seed}", name,
                            lambda a, b: a == b)
    return dict(first, arms={arm: [c[s] for s in sorted(c)] for arm, c in by_arm.items()},
                seeds={arm: sorted(c) for arm, c in by_arm.items()})


def pooled_table(reports: list[tuple[str, dict]], arm: str, guarded: bool = False) -> str:
    """One arm across several tasks' ablations (`(name, report)` each): a row per task against its own
    SFT checkpoint, and their mean with `pooled_over_tasks`' interval (the tasks fixed). `guarded`:
    the arm's guarded rows."""
    rows, differences = [], []
    for name, report in reports:
        if guarded and "guarded" not in report:
            raise ValueError(f"{name} has no guarded rows; its ablation needs ablation.guard_protocol")
        found = [a for a in report["guarded" if guarded else "arms"] if a["arm"] == arm]
        if not found:
            raise ValueError(f"{name} has no arm {arm!r}; its arms: {[a['arm'] for a in report['arms']]}")
        (result,) = found
        s = report["eval_settings"]
        differences.append(result["vs_sft"])
        rows.append(f"| {name} | {s['suite']} {s['tasks']} | {100 * report['sft']['success_rate']:.1f}% | "
                    f"{100 * result['held_out']['mean']:.1f}% | {_seed_level(result['vs_sft'])} | "
                    + ", ".join(f"{100 * x:.0f}%" for x in result["held_out_per_seed"]) + " |")
    pooled = pooled_over_tasks(differences)
    return "\n".join([
        f"# Arm {arm}{', guarded,' if guarded else ''} across {len(reports)} tasks' ablations, each against its own "
        "SFT checkpoint", "",
        "| ablation | task | SFT | held out, mean over seeds | vs SFT, seed-level [95% CI] | per seed |",
        "|---|---|---|---|---|---|", *rows,
        f"| mean over the {len(reports)} tasks | | | | {100 * pooled['difference']:+.1f} {_pct(pooled['ci95'])}, "
        f"p={pooled['p']:.2g} | |", "",
        "The mean's interval adds the tasks' seed-level variances (t, Welch-Satterthwaite degrees of freedom): it is "
        "about these tasks, held fixed, not about a task drawn from the suite.", ""])


def main(args) -> None:
    if args.merge and (not args.from_json or len(args.from_json) < 2 or args.guarded):
        raise ValueError("ablate --merge pools the cells of several --from-json reports of one ablation (without "
                         "--guarded)")
    if args.from_json:
        if args.recipe or args.overrides:
            raise ValueError("ablate --from-json recomputes a written report; it takes no recipe or overrides")
        if args.guarded and len(args.from_json) == 1:
            raise ValueError("ablate --guarded pools the guarded rows of several --from-json reports; one report's "
                             "table shows its guarded rows already")
        if args.merge:
            evidence = merge_evidence([(path, evidence_from_json(Path(path))) for path in args.from_json])
        elif len(args.from_json) > 1:
            if args.out or args.against:
                raise ValueError("ablate --out writes one report, and --against recomputes one; with several "
                                 "--from-json it prints the pooled table")
            print(pooled_table([(path, report_from_json(Path(path))) for path in args.from_json], args.arm,
                               args.guarded))
            return
        else:
            evidence = evidence_from_json(Path(args.from_json[0]))
        report = summarize_ablation(against(evidence, args.against) if args.against else evidence)
        if args.out:
            write_report(report, Path(args.out))
        else:
            print(ablation_table(report))
        return
    if args.guarded:
        raise ValueError("ablate --guarded goes with several --from-json reports; a recipe's guarded rows come from "
                         "ablation.guard_protocol")
    if args.against:
        raise ValueError("ablate --against recomputes a written report (with --from-json); a recipe's arms are "
                         "compared with its first")
    if not args.recipe:
        raise ValueError("ablate needs a recipe (e.g. recipes/rl_cpu.yaml), or --from-json ablation.json")
    recipe = load_recipe(AblationRecipe, Path(args.recipe), args.overrides)
    if args.dry_run:
        report = dry_run(recipe)
        check_ablation(recipe)
        cells = sum(len(arm_seeds(recipe.ablation, arm)) for arm in recipe.ablation.arms)
        print(f"{args.recipe}: valid. {len(recipe.ablation.arms)} arm(s), {cells} cell(s) on {report['suite']} "
              f"task(s) {report['tasks']}")
        return
    run_ablation(recipe, args.parallel)
    out = Path(recipe.out) / "ablation"
    for protocol in protocols(recipe):
        print(f"ablation: {(out if protocol is None else out / eval_dirname(protocol)) / 'ablation.md'}")
