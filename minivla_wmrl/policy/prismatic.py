"""Import of a Prismatic MiniVLA run directory (openvla-mini's training output).

Prismatic: `config.json` ({"vla": ...}), `dataset_statistics.json`, `checkpoints/*.pt` holding
`{"model": {"vision_backbone", "projector", "llm_backbone"}}`; the VQ folder and a local Qwen
tokenizer directory come separately. Nothing is downloaded: modules are built from configs, then
the weights are loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from minivla_wmrl.policy.action_tokenizer import ActionTokenizer
from minivla_wmrl.policy.config import preset
from minivla_wmrl.policy.minivla import MiniVLA
from minivla_wmrl.policy.storage import read_dataset_statistics
from minivla_wmrl.policy.tokenizer import add_action_tokens


def prismatic_variant(run_config: dict, where: str) -> dict:
    """What of a Prismatic run's `config.json` changes how its weights must be run: the VQ MiniVLA
    with one image is supported; the binning variant (the base `action_tokenizer`/
    `extra_action_tokenizer`), image history (`vla.image_sequence_len` > 1) and the wrist variant
    (`vla.use_wrist_image`) are refused by name, since loading them would decode or feed inputs
    wrongly. Returns {"action_tokenizer", "center_crop"}: runs trained with `image_aug` are
    evaluated on centre crops, as openvla-mini's LIBERO eval does."""
    vla = run_config.get("vla")
    if not isinstance(vla, dict):
        raise ValueError(f"{where} is not a Prismatic VLA run config (no 'vla' entry)")
    tokenizer = vla.get("action_tokenizer", "action_tokenizer")
    if "vq" not in tokenizer:
        raise ValueError(f"{where}: vla.action_tokenizer {tokenizer!r} is the binning MiniVLA (one token per action "
                         "dimension); only the VQ variants (e.g. libero_vq_extra_action_tokenizer) are supported")
    if vla.get("image_sequence_len", 1) != 1:
        raise ValueError(f"{where}: vla.image_sequence_len {vla['image_sequence_len']} is the image-history variant; "
                         "only single-frame MiniVLA is supported")
    if vla.get("use_wrist_image", False):
        raise ValueError(f"{where}: vla.use_wrist_image is the wrist-camera variant; only the agent-view MiniVLA is "
                         "supported")
    return {"action_tokenizer": tokenizer, "center_crop": bool(run_config.get("image_aug", False))}


def import_prismatic(run_dir: Path, vq_dir: Path, qwen_dir: Path, preset_name: str = "minivla-1b",
                     unnorm_key: str | None = None, checkpoint: Path | None = None, center_crop: bool | None = None,
                     dtype: torch.dtype = torch.float32) -> MiniVLA:
    """Build `preset_name` from configs and load a Prismatic MiniVLA run's weights into it.

    `center_crop` None: as the run trained (its `image_aug`); `dtype`: float32, or bfloat16 as the
    reference evaluates the whole VLA."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{run_dir} is not a Prismatic VLA run directory (no config.json)")
    variant = prismatic_variant(json.loads(config_path.read_text()), str(config_path))
    if checkpoint is None:
        candidates = sorted((run_dir / "checkpoints").glob("*.pt"))
        if not candidates:
            raise FileNotFoundError(f"{run_dir}/checkpoints holds no *.pt checkpoint")
        checkpoint = candidates[-1]
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    parts = state.get("model", {}) if isinstance(state, dict) else {}
    missing = {"vision_backbone", "projector", "llm_backbone"} - set(parts)
    if missing:
        raise ValueError(f"{checkpoint} lacks model.{sorted(missing)}; "
                         "expected vision_backbone, projector, llm_backbone")

    tokenizer = AutoTokenizer.from_pretrained(qwen_dir)
    add_action_tokens(tokenizer)
    tokenizer.pad_token = tokenizer.pad_token or "<|endoftext|>"
    config = preset(preset_name)
    config.center_crop = variant["center_crop"] if center_crop is None else center_crop
    policy = MiniVLA(config, tokenizer, ActionTokenizer.from_pretrained(vq_dir),
                     read_dataset_statistics(run_dir / "dataset_statistics.json", unnorm_key))
    llm_state = {}
    for key, value in parts["llm_backbone"].items():
        if not key.startswith("llm."):
            raise ValueError(f"{checkpoint}: llm_backbone key {key!r} does not start with 'llm.'")
        llm_state[key[len("llm."):]] = value
    for name, module, part in (("vision_backbone", policy.vision, parts["vision_backbone"]),
                               ("projector", policy.projector, parts["projector"]),
                               ("llm_backbone", policy.llm, llm_state)):
        try:
            result = module.load_state_dict(part, strict=False)
        except RuntimeError as error:
            raise ValueError(f"{checkpoint}: model.{name} does not fit preset {preset_name!r}: {error}") from None
        unexpected = list(result.unexpected_keys)
        absent = [k for k in result.missing_keys if not k.endswith("lm_head.weight")]  # tied to the embeddings
        if unexpected or absent:
            raise ValueError(f"{checkpoint}: model.{name} does not match preset {preset_name!r}: missing {absent[:5]}, "
                             f"unexpected {unexpected[:5]}")
    return policy.to(dtype=dtype).eval()
