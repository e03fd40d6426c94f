"""`minivla-wmrl run RECIPE [--stage S] [--dry-run]`: one recipe, the whole pipeline, one run directory.

Stages, in order: demos (optional: scripted demonstrations) → vq (action tokenizer; skipped when
the released VQ is given) → sft → wm (world model) → grpo → wmrl (optional: a second GRPO run from
the same SFT checkpoint with the `wmrl.overrides`, e.g. gated execution) → eval (the SFT and GRPO
checkpoints, the suite's protocol). Each stage's section is that command's own recipe; the
pipeline fills in what connects them (data paths, the action tokenizer, checkpoints, the world
model) and writes everything under `out/`: `demos/ vq/ sft/ wm/ grpo/ wmrl/ eval/ plots/`.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Annotated

import torch

from envs.factory import GYM
from envs.gym_env import register_known_packages
from envs.libero_env import get_suite, resolve_task
from minivla_wmrl.data.gym_demos import generate_gym_demos
from minivla_wmrl.data.replay import replay_real_steps
from minivla_wmrl.evaluation.compare import compare, comparison_table
from minivla_wmrl.evaluation.evaluate import EvalConfig, EvalProtocol, evaluate, format_rate
from minivla_wmrl.evaluation.plots import plot_calibration, plot_gate, plot_training_curves
from minivla_wmrl.infra.config import (
    InputPath,
    Range,
    apply_overrides,
    check_input_paths,
    config_from_dict,
    load_recipe,
)
from minivla_wmrl.infra.outputs import create_output_dir, replaced_directory
from minivla_wmrl.infra.run_checkpoint import RUN_FILES, read_json, selected_checkpoint
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer, ActionTokenizerConfig
from minivla_wmrl.policy.config import preset
from minivla_wmrl.policy.info import parameter_counts
from minivla_wmrl.train.grpo import GRPORecipe, train_grpo, validate
from minivla_wmrl.train.sft import SFTRecipe, train_sft
from minivla_wmrl.train.vq import VQTrainConfig, run_vq
from minivla_wmrl.train.wm import WMRecipe, train_world_model
from world_models.progress_model import ProgressWorldModel

STAGES = ("demos", "vq", "sft", "wm", "grpo", "wmrl", "eval")
# the GRPO keys the pipeline sets for every run from its SFT checkpoint: a variant's overrides may not set them
CONNECTED_GRPO_KEYS = ("out", "grpo.seed", "policy.checkpoint", "env.suite", "env.tasks", "env.gym")
WHERE = {
    "data": "LIBERO demonstrations (hdf5): LIBERO's download script or "
            "huggingface.co/datasets/yifengzhu-hf/LIBERO-datasets",
    "minivla_run_dir": "the Prismatic MiniVLA run directory, e.g. "
                       "huggingface.co/Stanford-ILIAD/minivla-vq-libero90-prismatic",
    "vq_dir": "the released MiniVLA VQ folder (config.json + checkpoints/model.pt): "
              "huggingface.co/Stanford-ILIAD/pretrain_vq",
    "qwen_dir": "a local Qwen2.5-0.5B tokenizer directory: huggingface.co/Qwen/Qwen2.5-0.5B",
}


@dataclass
class Weights:
    """User-provided weights; all null trains from scratch (the small presets of the CPU demo)."""

    minivla_run_dir: Annotated[str | None, InputPath("dir")] = None
    vq_dir: Annotated[str | None, InputPath("dir")] = None
    qwen_dir: Annotated[str | None, InputPath("dir")] = None
    unnorm_key: str | None = None  # which dataset_statistics.json entry (e.g. libero_90)


@dataclass
class DemosStage:
    generate: bool = False  # record scripted demos (envs/experts.py) instead of reading `data`
    tasks: list[str] = field(default_factory=lambda: ["0"])
    num: Annotated[int, Range(1)] = 20
    max_episodes: Annotated[int, Range(1)] = 20
    resolution: Annotated[int, Range(8, high=1024)] = 128


@dataclass
class VQStage:
    train: VQTrainConfig = field(default_factory=VQTrainConfig)


@dataclass
class WMRLStage:
    """WMRL beside the `grpo` stage: a second GRPO run from the same SFT checkpoint and world model,
    its recipe the `grpo` section with these overrides, its checkpoint evaluated as `wmrl` (list it
    in eval.checkpoints) and its real simulator steps printed beside grpo's. No overrides: no stage."""

    overrides: list[str] = field(default_factory=list)  # GRPO recipe `key=value`s, e.g. "grpo.execution=gated"


@dataclass(kw_only=True)
class EvalStage(EvalProtocol):
    """`minivla-wmrl eval`'s protocol settings; the pipeline connects the suite, tasks and image
    convention, and supplies the checkpoint, device and output."""

    checkpoints: list[str] = field(default_factory=lambda: ["sft", "grpo"])  # which stages' checkpoints to evaluate


@dataclass
class PipelineRecipe:
    out: str = "runs/pipeline"
    suite: str = "libero_90"  # a LIBERO suite, or "gym" (tasks are then gymnasium env ids)
    tasks: list[str] = field(default_factory=lambda: ["0"])  # RL and evaluation tasks; ["all"]: the whole suite
    gym: dict = field(default_factory=dict)  # suite "gym": GymRobotEnv options (instruction, resolution, ...)
    data: Annotated[list[str], InputPath("either")] = field(default_factory=list)  # demonstration files or dirs
    weights: Weights = field(default_factory=Weights)
    demos: DemosStage = field(default_factory=DemosStage)
    vq: VQStage = field(default_factory=VQStage)
    sft: SFTRecipe = field(default_factory=SFTRecipe)
    wm: WMRecipe = field(default_factory=WMRecipe)
    grpo: GRPORecipe = field(default_factory=GRPORecipe)
    wmrl: WMRLStage = field(default_factory=WMRLStage)
    eval: EvalStage = field(default_factory=EvalStage)
    # `minivla-wmrl ablate`'s section, read and checked there (`ablation.AblationRecipe`); `run` ignores it
    ablation: dict = field(default_factory=dict)


def gate_replay(grpo: GRPORecipe, wm: WMRecipe) -> None:
    """Gated execution's first outcome predictor learns from the wm stage's collected rollouts of the
    SFT policy, when that stage collects and the GRPO recipe names no replay of its own."""
    if grpo.grpo.execution == "gated" and not grpo.gate.replay and wm.collect.episodes_per_task > 0:
        grpo.gate.replay = [str(Path(wm.out) / "replay")]


def connected_keys_set(overrides: list[str]) -> list[str]:
    """The keys among `key=value` overrides that the pipeline sets for every GRPO run (`CONNECTED_GRPO_KEYS`)."""
    keys = [o.split("=", 1)[0] for o in overrides]
    return [k for k in keys if any(k == c or k.startswith(c + ".") for c in CONNECTED_GRPO_KEYS)]


def grpo_variant(recipe: PipelineRecipe, overrides: list[str], out: Path, where: str) -> GRPORecipe:
    """The pipeline's GRPO section with `overrides`: another GRPO run from the same SFT checkpoint and
    world model (the wmrl stage, an ablation cell), writing to `out`."""
    refused = connected_keys_set(overrides)
    if refused:
        raise ValueError(f"{where} overrides {refused}: the pipeline sets these for every GRPO run "
                         f"({', '.join(CONNECTED_GRPO_KEYS)}); change them in the recipe's grpo section or top level")
    grpo = config_from_dict(GRPORecipe, apply_overrides(asdict(recipe.grpo), overrides), where)
    grpo.out = str(out)
    gate_replay(grpo, recipe.wm)
    return grpo


class Pipeline:
    def __init__(self, recipe: PipelineRecipe):
        self.r, self.out = recipe, Path(recipe.out)
        self.wired: set[str] = set()  # the stage inputs the pipeline connects (`_wire`)
        self.connect()

    # -- wiring -------------------------------------------------------------------------------------

    @property
    def data(self) -> list[str]:
        return [str(self.out / "demos")] if self.r.demos.generate else list(self.r.data)

    def connect(self) -> None:
        """Fill each stage's recipe with the outputs of the stages before it."""
        r, out, w, wire = self.r, self.out, self.r.weights, self._wire
        if r.tasks == ["all"] and r.suite != GYM:
            r.tasks = [str(i) for i in range(get_suite(r.suite).n_tasks)]
        wire("sft.out", str(out / "sft"))
        wire("sft.data.paths", self.data)
        wire("sft.vq.path", w.vq_dir or str(out / "vq" / "action_tokenizer"))
        if w.qwen_dir:
            wire("sft.policy.tokenizer", w.qwen_dir)
        if w.minivla_run_dir:
            wire("sft.policy.init_checkpoint", str(out / "pretrained"))
        convention = r.sft.data.image_convention  # every stage sees images as the policy was trained on them
        for key in ("wm.data.image_convention", "wm.collect.image_convention", "grpo.env.image_convention",
                    "eval.image_convention"):
            wire(key, convention)
        wire("wm.out", str(out / "wm"))
        wire("wm.data.demos", self.data)
        collects = r.wm.collect.episodes_per_task > 0
        if collects:
            wire("wm.collect.checkpoint", str(out / "sft" / "final"))
        for stage in ("wm.collect", "grpo.env", "eval") if collects else ("grpo.env", "eval"):
            wire(f"{stage}.suite", r.suite)
            wire(f"{stage}.tasks", list(r.tasks))
            wire(f"{stage}.gym", dict(r.gym))
        wire("grpo.out", str(out / "grpo"))
        wire("grpo.policy.checkpoint", str(out / "sft" / "final"))
        if r.grpo.world_model.name == "progress" and not r.grpo.world_model.options:
            r.grpo.world_model.options = {"path": str(out / "wm" / "world_model")}
        gate_replay(r.grpo, r.wm)
        if ("wmrl" in r.eval.checkpoints) != bool(r.wmrl.overrides):
            raise ValueError(f"eval.checkpoints {r.eval.checkpoints} and wmrl.overrides {r.wmrl.overrides}: the wmrl "
                             "stage runs when it has overrides, and is evaluated when eval.checkpoints lists it; set "
                             "both or neither")
        if r.wmrl.overrides:
            validate(self.wmrl_recipe())

    def _wire(self, key: str, value) -> None:
        """Set a stage input the pipeline owns (a dotted recipe key); a different value the user set
        there is refused, not silently replaced."""
        *parents, name = key.split(".")
        section = self.r
        for parent in parents:
            section = getattr(section, parent)
        declared = next(f for f in fields(section) if f.name == name)
        default = declared.default if declared.default is not MISSING else declared.default_factory()
        current = getattr(section, name)
        if current != default and current != value:
            raise ValueError(f"the pipeline recipe sets {key} = {current!r}, but the pipeline connects it to "
                             f"{value!r} (from the stage before or the top-level settings); remove {key} from the "
                             "recipe, or set what it comes from")
        setattr(section, name, value)
        self.wired.add(key)

    def required_inputs(self) -> list[tuple[str, str | None, bool]]:
        """(name, path, exists) of every user-provided input the recipe names or needs."""
        w, items = self.r.weights, []
        if not self.r.demos.generate:
            items += [("data", p, Path(p).exists()) for p in self.r.data] or [("data", None, False)]
        for name in ("minivla_run_dir", "vq_dir", "qwen_dir"):  # a pretrained run needs all three
            path = getattr(w, name)
            if path or w.minivla_run_dir:
                items.append((name, path, bool(path) and Path(path).is_dir()))  # a file there is named too
        return items

    def check_inputs(self) -> None:
        missing = [(name, path) for name, path, exists in self.required_inputs() if not exists]
        if missing:
            lines = [f"  {name}: {path or '(not set)'} — {WHERE[name]}" for name, path in missing]
            raise FileNotFoundError("the recipe needs these user-provided inputs:\n" + "\n".join(lines))
        # every other input path the user set: before any work (the connected ones are earlier stages' outputs)
        check_input_paths(self.r, "pipeline recipe", frozenset(self.wired))

    # -- stages ---------------------------------------------------------------------------------------

    def finished(self, stage: str) -> bool:
        """Whether a stage's output is complete (its final artefact is written atomically, last)."""
        done = {"demos": self.out / "demos" / "demos_report.json", "vq": self.out / "vq" / "action_tokenizer",
                "sft": self.out / "sft" / "final", "wm": self.out / "wm" / "world_model"}
        return stage in done and done[stage].exists()

    def eval_config(self, checkpoint: Path, out: Path) -> EvalConfig:
        """The recipe's evaluation protocol for one checkpoint (suite, tasks and images connected)."""
        protocol = {f.name: getattr(self.r.eval, f.name) for f in fields(EvalProtocol)}
        return EvalConfig(**protocol, checkpoint=str(checkpoint), out=str(out), device=self.r.sft.policy.device,
                          decoding=self.r.grpo.policy.decoding)

    def run(self, stages=STAGES, skip_finished: bool = False) -> dict:
        """Run `stages` in order; `skip_finished` keeps the outputs of stages already complete."""
        self.check_inputs()
        create_output_dir(self.out, "pipeline")
        (self.out / "pipeline_recipe.json").write_text(json.dumps(asdict(self.r), indent=2, default=str))
        results, times_path = {}, self.out / "stage_times.json"
        times = json.loads(times_path.read_text()) if times_path.exists() else {}
        for stage in stages:
            if stage == "vq" and self.r.weights.vq_dir:
                continue
            if stage == "demos" and not self.r.demos.generate or stage == "wmrl" and not self.r.wmrl.overrides:
                continue
            if skip_finished and self.finished(stage):
                print(f"== stage {stage}: finished earlier, kept", flush=True)
                continue
            print(f"== stage {stage}", flush=True)
            start = time.perf_counter()
            results[stage] = getattr(self, f"stage_{stage}")()
            times[stage] = round(time.perf_counter() - start, 1)
            times_path.write_text(json.dumps(times, indent=2))
        print("wall time per stage (s): " + ", ".join(f"{k} {v}" for k, v in times.items()))
        return results

    def stage_demos(self) -> list[dict]:
        d, states = self.r.demos, list(range(self.r.demos.max_episodes))
        if self.r.suite == GYM:
            reports = [generate_gym_demos(task, self.r.gym["instruction"], d.num, self.out / "demos", states,
                                          self.r.gym.get("resolution", 224)) for task in d.tasks]
        else:
            from minivla_wmrl.data.demos import generate_demos  # imports robosuite (simulator, ~0.5 s): LIBERO only

            reports = [generate_demos(self.r.suite, task, d.num, self.out / "demos", states, d.resolution)
                       for task in d.tasks]
        (self.out / "demos" / "demos_report.json").write_text(json.dumps(reports, indent=2))
        return reports

    def stage_vq(self) -> dict:
        return run_vq(self.data, self.out / "vq", self.r.vq.train, self.r.sft.data.chunk_len,
                      self.r.sft.data.dataset_name)

    def stage_sft(self) -> dict:
        w = self.r.weights
        if w.minivla_run_dir and not (self.out / "pretrained").exists():
            from minivla_wmrl.policy.prismatic import import_prismatic  # imports transformers (~1 s): conversion only

            import_prismatic(Path(w.minivla_run_dir), Path(w.vq_dir), Path(w.qwen_dir), self.r.sft.policy.preset,
                             w.unnorm_key).save_pretrained(self.out / "pretrained")
        result = train_sft(self.r.sft)
        # the checkpoint later stages start from
        with replaced_directory(self.out / "sft" / "final", "checkpoint") as tmp:
            shutil.copytree(result["checkpoint"], tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*RUN_FILES))
        return {k: v for k, v in result.items() if k != "history"}

    def stage_wm(self) -> dict:
        result = train_world_model(self.r.wm)
        return {k: v for k, v in result.items() if k not in ("model", "trainer")}

    def wmrl_recipe(self) -> GRPORecipe:
        return grpo_variant(self.r, self.r.wmrl.overrides, self.out / "wmrl", "wmrl.overrides")

    def stage_grpo(self) -> dict:
        return self._grpo(self.r.grpo, "")

    def stage_wmrl(self) -> dict:
        return self._grpo(self.wmrl_recipe(), "wmrl_")

    def _grpo(self, recipe: GRPORecipe, prefix: str) -> dict:
        """Train; plot what stood in for real execution: the gate's anchors (gated execution) or the
        world model's calibration pairs (dense rewards); plain sparse GRPO has neither."""
        result = train_grpo(recipe)
        trainer = result["trainer"]
        if trainer.gate is not None:
            plot_gate(trainer.gate, self.out / "plots" / f"{prefix}gate.png")
        elif trainer.debiaser.pairs:
            plot_calibration(trainer.debiaser, self.out / "plots" / f"{prefix}wm_calibration.png")
        return {"checkpoint": result["checkpoint"], "last": result["history"][-1] if result["history"] else {}}

    def stage_eval(self) -> dict:
        e, infos, directories = self.r.eval, {}, []
        for name in e.checkpoints:
            # GRPO's result: its best checkpoint by validation success when it validated, else its latest
            checkpoint = self.out / "sft" / "final" if name == "sft" else selected_checkpoint(self.out / name)
            if checkpoint is None or not Path(checkpoint).exists():
                raise FileNotFoundError(f"no {name} checkpoint under {self.out / name}; run --stage {name} first")
            # one directory per checkpoint: a continued run's newer checkpoint gets its own evaluation
            directories.append(self.out / "eval" / name / Path(checkpoint).name)
            infos[name] = evaluate(self.eval_config(checkpoint, directories[-1]))
        plot_training_curves(self.out, self.out / "plots" / "training_curves.png")
        table = success_table(infos)
        if len(directories) > 1:  # each later checkpoint against the first, episode by episode
            table += ("\nPaired comparison (same init states and sampling seeds):\n\n"
                      + comparison_table(compare(directories)))
        runs = [name for name in e.checkpoints if name != "sft"]
        if runs:
            table += "\n" + real_cost_table({name: self.out / name for name in runs})
        (self.out / "eval" / "success_table.md").write_text(table)
        print(table)
        return infos


def success_table(infos: dict[str, dict]) -> str:
    """Success per task and overall for each evaluated checkpoint, with 95% Wilson intervals."""
    names = list(infos)
    first = next(iter(infos.values()))
    lines = ["| task | instruction | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for k, task in enumerate(first["per_task"]):
        cells = [format_rate(infos[n]["per_task"][k]) for n in names]
        lines.append(f"| {task['task']} | {task['instruction']} | " + " | ".join(cells) + " |")
    lines.append("| all | | " + " | ".join(format_rate(infos[n]["overall"]) for n in names) + " |")
    return "\n".join(lines) + "\n"


def real_cost_table(runs: dict[str, Path]) -> str:
    """What each GRPO run executed in the real simulator (reset wait steps included), from its metrics:
    training rollouts, those the gate or horizon cut, and the guard's validation episodes apart; and
    the episodes a gated run's gate started from (the wm stage's collection: a first run on a task pays
    them), with the ratio they leave when charged to it."""
    lines = ["| GRPO run | simulator steps (training rollouts) | × fewer than the first | episodes | cut | "
             "validation steps | the gate's replay (episode steps) | × fewer, replay charged |",
             "|---|---|---|---|---|---|---|---|"]
    first = None
    for name, directory in runs.items():
        last = json.loads((Path(directory) / "metrics.jsonl").read_text().splitlines()[-1])
        first = first or last["sim_steps"]
        replay = gate_replay_real_steps(Path(directory))
        lines.append(f"| {name} | {last['sim_steps']} | {first / last['sim_steps']:.2f}× | {last['real_episodes']} | "
                     f"{last['truncated_episodes']} | {last['validation_real_steps']} | {replay} | "
                     f"{first / (last['sim_steps'] + replay):.2f}× |")
    return "\n".join(lines) + "\n"


def gate_replay_real_steps(directory: Path) -> int:
    """Real steps of the episodes a gated GRPO run's gate started from (`gate.replay`: the wm stage's
    collection, earlier runs), which the run's own count leaves out; 0 for other executions (and runs
    recorded before the gate existed). Read when asked: a replay directory that grew since counts whole."""
    recipe = read_json(Path(directory) / "recipe.json", "the GRPO run's recipe")
    if recipe.get("grpo", {}).get("execution") != "gated" or not recipe.get("gate", {}).get("replay"):
        return 0
    return replay_real_steps(recipe["gate"]["replay"])


def dry_run(recipe: PipelineRecipe) -> dict:
    """Validate the recipe and build every component on the meta device; report the user inputs."""
    pipeline = Pipeline(recipe)
    if recipe.suite == GYM:
        import gymnasium  # ~0.2 s: only gymnasium recipes need it (LIBERO ones do not)

        register_known_packages()
        unknown = [t for t in recipe.tasks if t not in gymnasium.registry]
        if unknown or "instruction" not in recipe.gym:
            raise ValueError(f"gym recipe: unknown env id(s) {unknown}" if unknown
                             else "gym recipe needs gym.instruction")
        tasks = list(recipe.tasks)
    else:
        bench = get_suite(recipe.suite)
        tasks = [resolve_task(bench, t) for t in recipe.tasks]
    validate(recipe.grpo)
    counts = parameter_counts(preset(recipe.sft.policy.preset))
    with torch.device("meta"):
        tokenizer = ActionTokenizer(ActionTokenizerConfig(chunk_len=recipe.sft.data.chunk_len))
        world_model = ProgressWorldModel(recipe.wm.model)
    return {"suite": recipe.suite, "tasks": tasks, "policy_parameters": counts["total"],
            "action_tokenizer_parameters": sum(p.numel() for p in tokenizer.parameters()),
            "world_model_parameters": sum(p.numel() for p in world_model.parameters()),
            "inputs": [{"name": n, "path": p, "exists": e, "where": WHERE[n]}
                       for n, p, e in pipeline.required_inputs()]}


def main(args) -> None:
    recipe = load_recipe(PipelineRecipe, Path(args.recipe), args.overrides)
    if args.dry_run:
        report = dry_run(recipe)
        print(f"{args.recipe}: valid. {report['suite']}, {len(report['tasks'])} task(s); policy "
              f"{report['policy_parameters'] / 1e6:.1f} M, "
              f"action tokenizer {report['action_tokenizer_parameters'] / 1e6:.2f} M, "
              f"world model {report['world_model_parameters'] / 1e6:.2f} M parameters (built on meta)")
        for item in report["inputs"]:
            state = "ok" if item["exists"] else "MISSING"
            print(f"  {state:7s} {item['name']}: {item['path'] or '(not set)'} — {item['where']}")
        if recipe.ablation:
            print(f"  its ablation: section is checked by `minivla-wmrl ablate {args.recipe} --dry-run`")
        return
    stages = STAGES if args.stage is None else (args.stage,)
    Pipeline(recipe).run(stages)
    print(f"run directory: {recipe.out}")
