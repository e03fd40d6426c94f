"""Robometer, the video-language progress model WMRL scores LIBERO rollouts with, as a world model.

Faithful to the published model (robometer/robometer `robometer/models/rbm.py`, `heads.py`,
`data/collators/rbm_heads.py`; WMRL uses `jesbu1/robometer-4b-fft-libero`, Robometer-4B
fine-tuned on LIBERO):
- Architecture: the bare `Qwen3VLModel` (Qwen3-VL-4B-Instruct, no LM head) plus heads
  `Linear(H, H/2) → LayerNorm → GELU → Dropout → Linear(H/2, out)` reading the last hidden state at
  the `<|prog_token|>` that follows each frame: `progress_head` (10 bins), `success_head` (a logit).
- Input: 8 frames sampled uniformly (first and last included; a shorter trajectory repeats its
  last frame), given as a list of images each followed by `<|prog_token|>`, sides rounded to
  multiples of 32 and not resized again by the processor; the instruction in the prompt below;
  the Qwen3-VL chat template with `add_vision_id`.
- Output: per-frame progress = the softmax-weighted mean of the bin centres linspace(0, 1, bins)
  (a single output is a sigmoid, the continuous variant); success = sigmoid of the last frame's logit.
Published layout: `config.json` (a Qwen3VLConfig, `architectures: ["RFM"]`) and safetensors weights
(sharded with `model.safetensors.index.json`, or one file) keyed `model.visual.*`,
`model.language_model.*`, `progress_head.*`, `success_head.*` (plus training-only `preference_head.*`
and `frame_pool_attn.*`). The tokenizer and processor are Qwen3-VL-4B-Instruct's, which the
repository does not hold: pass their directory as `processor`; the five Robometer tokens are added
in the published order if missing. Frames are expected upright as MiniVLA sees them (LIBERO's raw
frames flipped vertically), which is how Robometer's LIBERO training frames were oriented.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file
from torch import nn

from world_models.scorer import Prediction, TrajectoryScorer, check_trajectories

PROMPT = ("The task for the robot is '{task}'. Given the trajectory video, predict the task progress at each frame, "
          "how far along the robot is towards completing the task, a float between 0 and 1, where 0 is the starting "
          "state and 1 is when the task is completed. If the robot is not performing the same task, predict 0 "
          "progress.")
ADDED_TOKENS = ("<|split_token|>", "<|reward_token|>", "<|pref_token|>", "<|sim_token|>", "<|prog_token|>")
PROGRESS_TOKEN = "<|prog_token|>"
PATCH_FACTOR = 32  # patch 16 × merge 2: Robometer rounds frame sides to multiples of this (qwen_vl_utils)
MIN_PIXELS, MAX_PIXELS = 4 * PATCH_FACTOR ** 2, 16384 * PATCH_FACTOR ** 2
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def head(hidden: int, out: int) -> nn.Sequential:
    """Robometer's prediction head; weights at indices 0, 1 and 4, as in the checkpoint."""
    layers = [nn.Linear(hidden, hidden // 2), nn.LayerNorm(hidden // 2), nn.GELU(), nn.Dropout(0.1),
              nn.Linear(hidden // 2, out)]
    return nn.Sequential(*layers)


def weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return sorted({path / name for name in json.loads(index.read_text())["weight_map"].values()})
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    raise FileNotFoundError(f"Robometer directory {path} holds neither model.safetensors.index.json nor "
                            "model.safetensors")


class RobometerScorer(TrajectoryScorer):
    def __init__(self, path: str, processor: str | None = None, device: str = "cpu", dtype: str = "bfloat16",
                 num_frames: int = 8):
        from transformers import AutoConfig, AutoProcessor, Qwen3VLModel  # ~3 s over torch: only Robometer users

        path = Path(path).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"Robometer directory {path} has no config.json")
        if dtype not in DTYPES:
            raise ValueError(f"robometer dtype {dtype!r}: expected one of {sorted(DTYPES)}")
        config = AutoConfig.from_pretrained(path)
        if config.model_type != "qwen3_vl":
            raise ValueError(f"{path}/config.json has model_type {config.model_type!r}; Robometer is a qwen3_vl model")
        self.processor = AutoProcessor.from_pretrained(Path(processor).expanduser() if processor else path)
        tokenizer = self.processor.tokenizer
        missing = [t for t in ADDED_TOKENS if t not in tokenizer.get_vocab()]
        if missing:
            tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
        if len(tokenizer) != config.text_config.vocab_size:
            raise ValueError(f"the tokenizer from {processor or path} has {len(tokenizer)} tokens with Robometer's; "
                             f"the model's vocabulary is {config.text_config.vocab_size} (is it Qwen3-VL's?)")
        self.progress_token = tokenizer.convert_tokens_to_ids(PROGRESS_TOKEN)

        state = {}
        for file in weight_files(path):
            state.update(load_file(file))
        hidden = config.text_config.hidden_size
        bins = state.get("progress_head.4.weight", torch.empty(0)).shape[0]
        self.model = Qwen3VLModel(config)
        self.progress_head, self.success_head = head(hidden, max(bins, 1)), head(hidden, 1)
        parts = {"model.": self.model, "progress_head.": self.progress_head, "success_head.": self.success_head}
        for prefix, module in parts.items():
            weights = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            try:
                module.load_state_dict(weights, strict=True)
            except RuntimeError as error:
                raise ValueError(f"{path}: the {prefix[:-1]} weights do not fit config.json "
                                 f"({str(error).splitlines()[1:2]})") from None
        self.bins, self.num_frames = bins, num_frames
        self.device, self.dtype = torch.device(device), DTYPES[dtype]
        for module in parts.values():
            module.to(self.device, self.dtype).eval()

    def sample(self, trajectories, instructions) -> np.ndarray:
        """Robometer's sampling: uniform with first and last when long enough, else every frame then the
        last one repeated."""
        check_trajectories(trajectories, instructions)
        picks = [np.rint(np.linspace(0, len(f) - 1, self.num_frames)).astype(int) if len(f) >= self.num_frames
                 else np.r_[np.arange(len(f)), np.full(self.num_frames - len(f), len(f) - 1)] for f in trajectories]
        return np.stack([np.asarray(f)[p] for f, p in zip(trajectories, picks)])

    def _images(self, frames: np.ndarray) -> list:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize  # transformers: ~0.5 s

        height, width = smart_resize(frames.shape[1], frames.shape[2], PATCH_FACTOR, MIN_PIXELS, MAX_PIXELS)
        images = [Image.fromarray(np.ascontiguousarray(f)) for f in frames]
        return [i if i.size == (width, height) else i.resize((width, height), Image.BICUBIC) for i in images]

    @torch.no_grad()
    def predict(self, frames: np.ndarray, instructions: list[str]) -> Prediction:
        texts, images = [], []
        for trajectory, instruction in zip(frames, instructions):
            content = [{"type": "text", "text": PROMPT.format(task=instruction)}]
            for image in self._images(trajectory):
                content += [{"type": "image", "image": image}, {"type": "text", "text": PROGRESS_TOKEN}]
                images.append(image)
            texts.append(self.processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                            add_generation_prompt=False, add_vision_id=True))
        self.processor.tokenizer.padding_side = "right"
        inputs = self.processor(text=texts, images=images, do_resize=False, padding=True, return_tensors="pt")
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        hidden = self.model(**inputs, use_cache=False).last_hidden_state
        at = inputs["input_ids"] == self.progress_token
        if not torch.equal(at.sum(1), torch.full_like(at.sum(1), frames.shape[1])):
            raise RuntimeError(f"the prompt holds {at.sum(1).tolist()} {PROGRESS_TOKEN} tokens; expected one per frame")
        tokens = hidden[at].view(len(frames), frames.shape[1], -1)
        logits = self.progress_head(tokens).float()
        if self.bins > 1:
            progress = (logits.softmax(-1) * torch.linspace(0, 1, self.bins, device=logits.device)).sum(-1)
        else:
            progress = torch.sigmoid(logits[..., 0])
        success = torch.sigmoid(self.success_head(tokens[:, -1]).float()[:, 0])
        return Prediction(progress.clamp(0, 1).cpu().numpy(), success.cpu().numpy())
