"""The MiniVLA model: images + instruction → 7 action tokens → an 8-step action chunk.

Sequence (as Prismatic/MiniVLA build it): the Qwen chat prompt's first token, then the projected
patch embeddings (256 per image), then the rest of the prompt; the 7 action tokens follow.
Batches are left-padded so every row's prompt ends at the last position, which lets one KV cache
serve the whole batch during generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from minivla_wmrl.infra.atomic_pretrained import AtomicPretrained
from minivla_wmrl.infra.outputs import replaced_directory
from minivla_wmrl.infra.run_checkpoint import load_weights
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer
from minivla_wmrl.policy.config import MiniVLAConfig
from minivla_wmrl.policy.decoding import Decoding, make_decoder, prompt_positions
from minivla_wmrl.policy.normalization import ActionStatistics, gripper_to_env
from minivla_wmrl.policy.storage import read_policy, write_policy
from minivla_wmrl.policy.tokenizer import END_TOKENS, build_prompt, check_action_tokens

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CENTER_CROP_AREA = 0.9  # openvla-mini's eval crop: the training augmentation's random-resized-crop scale


def center_crop(images: np.ndarray, area: float = CENTER_CROP_AREA) -> np.ndarray:
    """openvla-mini's LIBERO evaluation transform for runs trained with image augmentation: the
    central square of `area` of each uint8 image (side int(sqrt(area)·size), offset
    int((size − side) / 2)), resized back with PIL's bilinear filter, on (..., size, size, 3)."""
    size = images.shape[-2]
    side = int(np.sqrt(area) * size)
    offset = int((size - side) / 2)
    flat = images.reshape(-1, size, size, 3)[:, offset:offset + side, offset:offset + side]
    resized = [np.asarray(Image.fromarray(f).resize((size, size), Image.Resampling.BILINEAR)) for f in flat]
    return np.stack(resized).reshape(images.shape)


class FusedVisionBackbone(nn.Module):
    """DINOv2 and SigLIP (timm), features from each one's second-to-last block, concatenated per patch."""

    def __init__(self, config: MiniVLAConfig):
        super().__init__()
        import timm  # ~2 s over torch: only a built policy needs it (policy.config users do not)

        def vit(name: str, overrides: dict) -> nn.Module:
            return timm.create_model(name, pretrained=False, num_classes=0, img_size=config.image_size, **overrides)

        self.dino_featurizer = vit(config.dino, config.dino_overrides)
        self.siglip_featurizer = vit(config.siglip, config.siglip_overrides)
        self.register_buffer("dino_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("dino_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.embed_dim = self.dino_featurizer.embed_dim + self.siglip_featurizer.embed_dim
        self.num_patches = self.dino_featurizer.patch_embed.num_patches

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels (N, 3, H, W) in [0, 1] → (N, num_patches, dino_dim + siglip_dim)."""
        return torch.cat([self._second_to_last(self.dino_featurizer, (pixels - self.dino_mean) / self.dino_std),
                          self._second_to_last(self.siglip_featurizer, (pixels - 0.5) / 0.5)], dim=-1)

    @staticmethod
    def _second_to_last(vit: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        """Patch features after the second-to-last block, as Prismatic's `get_intermediate_layers`
        gives them, without running the last block (which that call runs and discards)."""
        return vit.forward_intermediates(pixels, indices=[len(vit.blocks) - 2], stop_early=True,
                                         intermediates_only=True, output_fmt="NLC")[0]


class FusedMLPProjector(nn.Module):
    """Prismatic's "fused GELU MLP": vision → mult × vision → llm → llm."""

    def __init__(self, vision_dim: int, llm_dim: int, mult: int = 4):
        super().__init__()
        self.projector = nn.Sequential(nn.Linear(vision_dim, mult * vision_dim), nn.GELU(),
                                       nn.Linear(mult * vision_dim, llm_dim), nn.GELU(), nn.Linear(llm_dim, llm_dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.projector(features)


@dataclass
class ActionQuery:
    """One batched policy query: tokens, their log-probs, and the decoded chunks."""

    token_ids: torch.Tensor  # (B, 7) language-model ids
    log_probs: torch.Tensor  # (B, 7) under the sampling distribution (logits / temperature)
    codes: torch.Tensor  # (B, 7) VQ codes, clipped to the codebook
    normalized_chunks: np.ndarray  # (B, chunk_len, action_dim) in training convention
    actions: np.ndarray | None  # (B, chunk_len, action_dim) in the env's convention (needs statistics)


class MiniVLA(nn.Module, AtomicPretrained):
    """The policy. `tokenizer` must hold the action tokens; `statistics` un-normalise actions.

    `save_pretrained(dir)` / `MiniVLA.from_pretrained(dir_or_repo_id, device=..., dtype=...)`: the
    checkpoint format of `policy.checkpoint`; `save_adapter(dir)`: the LoRA adapters alone, for peft."""

    _pretrained_kind = "policy checkpoint"

    def __init__(self, config: MiniVLAConfig, tokenizer, action_tokenizer: ActionTokenizer,
                 statistics: ActionStatistics | None = None):
        super().__init__()
        from transformers import Qwen2Config, Qwen2ForCausalLM  # ~3 s over torch: only a built policy needs it

        check_action_tokens(tokenizer, config.codebook_size)
        vq = action_tokenizer.config
        if (vq.num_codebooks, vq.codebook_size) != (config.num_action_tokens, config.codebook_size):
            raise ValueError(f"action tokenizer has {vq.num_codebooks} codebooks x {vq.codebook_size} codes; "
                             f"the policy expects {config.num_action_tokens} x {config.codebook_size}")
        if len(tokenizer) > config.llm["vocab_size"]:
            raise ValueError(f"tokenizer has {len(tokenizer)} tokens but the language model only "
                             f"{config.llm['vocab_size']} embedding rows")
        self.config = config
        self.vision = FusedVisionBackbone(config)
        self.projector = FusedMLPProjector(self.vision.embed_dim, config.llm["hidden_size"], config.projector_mult)
        self.llm = Qwen2ForCausalLM(Qwen2Config(**config.llm))
        self.tokenizer, self.statistics = tokenizer, statistics
        object.__setattr__(self, "action_tokenizer", action_tokenizer.eval())  # saved on its own, kept on the CPU
        self._prompt_ids: dict[str, list[int]] = {}
        self.decoding: Decoding = "dynamic"
        object.__setattr__(self, "_decoders", {"dynamic": make_decoder("dynamic")})  # kept: switching back is free

    @property
    def vocab_len(self) -> int:
        return len(self.tokenizer)

    @property
    def device(self) -> torch.device:
        return self.projector.projector[0].weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.projector.projector[0].weight.dtype

    # -- training switches -----------------------------------------------------------------------

    def set_trainable(self, vision: bool = True, projector: bool = True, llm: bool = True) -> None:
        for module, flag in ((self.vision, vision), (self.projector, projector), (self.llm, llm)):
            module.requires_grad_(flag)

    def configure_training(self, lora: bool = False, lora_r: int = 16, lora_alpha: int = 32,
                           freeze_vision: bool = False, fresh_adapters: bool = False) -> None:
        """Set what trains. With LoRA only the language model's adapters train (added here when
        missing; with `fresh_adapters`, existing ones are merged into the weights first, so the
        model with its adapters disabled is exactly the starting policy: GRPO's KL reference).
        Without LoRA the projector and the language model train; the vision backbone trains unless frozen."""
        if lora and getattr(self, "lora", None) and fresh_adapters:
            self.llm = self.llm.merge_and_unload()
            self.lora = None
        if lora and not getattr(self, "lora", None):
            self.add_lora(lora_r, lora_alpha)
        self.set_trainable(vision=not freeze_vision, projector=not lora, llm=not lora)
        if lora:
            for name, parameter in self.llm.named_parameters():
                parameter.requires_grad_("lora_" in name)

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Recompute each ViT block's and each language-model layer's activations in the backward pass
        instead of keeping them (training only: generation runs in eval mode and is unaffected). The
        same gradients for a fraction of the activation memory, at about one more forward's compute."""
        for vit in (self.vision.dino_featurizer, self.vision.siglip_featurizer):
            vit.set_grad_checkpointing(enabled)
        llm = self.llm.get_base_model() if hasattr(self.llm, "get_base_model") else self.llm
        if enabled:  # non-reentrant: gradients reach LoRA adapters even when the inputs need none
            llm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            llm.activation_checkpointing_disable()

    def set_decoding(self, decoding: Decoding) -> None:
        """How `generate` runs its decode steps (`policy.decoding`): "dynamic", "static" (a preallocated
        KV cache) or "compiled" (that cache with the step under torch.compile; CUDA graphs on CUDA).
        The same tokens in float32 (in bfloat16 up to rounding); see `policy/decoding.py`."""
        if decoding not in self._decoders:
            self._decoders[decoding] = make_decoder(decoding)
        self.decoding = decoding

    def add_lora(self, r: int = 16, alpha: int = 32, dropout: float = 0.0, targets=LORA_TARGETS) -> None:
        """Wrap the language model with peft LoRA adapters; only the adapters of the LLM train."""
        from peft import LoraConfig, get_peft_model  # ~3 s (with transformers): only LoRA fine-tuning needs it

        self.llm = get_peft_model(self.llm, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                                                       target_modules=list(targets)))
        self.lora = dict(r=r, alpha=alpha, dropout=dropout, targets=list(targets))

    # -- persistence -------------------------------------------------------------------------------

    def _save_pretrained(self, directory: Path) -> None:
        write_policy(self, directory)

    @classmethod
    def load(cls, directory: Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> MiniVLA:
        files = read_policy(directory)
        policy = cls(files.config, files.tokenizer, files.action_tokenizer, files.statistics)
        if files.lora:
            policy.add_lora(files.lora["r"], files.lora["alpha"], files.lora["dropout"], files.lora["targets"])
        load_weights(policy, files.weights)
        return policy.to(device=device, dtype=dtype).eval()

    def card_facts(self) -> dict:
        parameters = sum(p.numel() for p in self.parameters())
        statistics = self.statistics
        return {"what": f"A MiniVLA policy ({parameters / 1e6:.1f} M parameters: fused DINOv2/SigLIP vision, "
                        f"Qwen2 language model, {self.config.num_action_tokens} residual-VQ action tokens per "
                        f"chunk of {self.action_tokenizer.config.chunk_len} actions).",
                "base": self.source or "none (trained from its config)",
                "data": (f"actions normalised by the statistics of {statistics.num_trajectories} demonstrations "
                         f"({statistics.num_transitions} transitions)" if statistics is not None else "not recorded")}

    def save_adapter(self, directory: Path, base_model: str | None = None) -> None:
        """The language model's LoRA adapters alone, in peft's format (`adapter_config.json` +
        `adapter_model.safetensors`): `PeftModel.from_pretrained(policy.llm, directory)` loads them
        onto the language model of `base_model` (default: the checkpoint this policy was loaded
        from), which `adapter_config.json` records as `base_model_name_or_path`."""
        if not getattr(self, "lora", None):
            raise ValueError("this policy has no LoRA adapters to export (it was trained without lora)")
        base = base_model or self.source
        if base is None:
            raise ValueError("save_adapter: this policy was not loaded from a checkpoint; name the one its adapters "
                             "belong to: save_adapter(directory, base_model=path_or_hub_id)")
        for config in self.llm.peft_config.values():
            config.base_model_name_or_path = str(base)
        with replaced_directory(Path(directory), "save_adapter") as tmp:
            self.llm.save_pretrained(tmp)

    # -- inputs ------------------------------------------------------------------------------------

    def _pixels(self, images) -> torch.Tensor:
        images = torch.as_tensor(np.asarray(images))
        n, size = self.config.num_images, self.config.image_size
        expected = (size, size, 3) if n == 1 else (n, size, size, 3)
        if images.dtype != torch.uint8 or tuple(images.shape[1:]) != expected:
            raise ValueError(f"images have shape {tuple(images.shape)} and dtype {images.dtype}; expected uint8 "
                             f"(batch, {', '.join(map(str, expected))}) upright RGB at {size} px")
        if self.config.center_crop:
            images = torch.from_numpy(center_crop(images.numpy()))
        images = images.reshape(-1, size, size, 3).permute(0, 3, 1, 2)
        return images.to(self.device).to(self.dtype) / 255.0  # moved as uint8: a quarter of float32's bytes

    def embed_images(self, images) -> torch.Tensor:
        """(B, [num_images,] H, W, 3) uint8 → projected patch embeddings (B, num_images × patches, llm_dim)."""
        features = self.projector(self.vision(self._pixels(images)))
        return features.reshape(-1, self.config.num_images * features.shape[1], features.shape[2])

    def _prompt(self, instruction: str) -> list[int]:
        if instruction not in self._prompt_ids:
            self._prompt_ids[instruction] = self.tokenizer(build_prompt(instruction),
                                                           add_special_tokens=False).input_ids
        return self._prompt_ids[instruction]

    def prefix(self, images, instructions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded input embeddings [first token, patches, rest of prompt] and their attention mask."""
        if len(instructions) != len(images):
            raise ValueError(f"got {len(images)} images and {len(instructions)} instructions")
        patches = self.embed_images(images)
        embed = self.llm.get_input_embeddings()
        prompts = [torch.tensor(self._prompt(i), device=self.device) for i in instructions]
        length = patches.shape[1] + max(len(p) for p in prompts)
        rows, masks = [], []
        for prompt, row_patches in zip(prompts, patches):
            tokens = embed(prompt)
            pad = length - patches.shape[1] - len(prompt)
            rows.append(torch.cat([tokens.new_zeros(pad, tokens.shape[1]), tokens[:1], row_patches, tokens[1:]]))
            masks.append(torch.cat([torch.zeros(pad, dtype=torch.long), torch.ones(length - pad, dtype=torch.long)]))
        return torch.stack(rows), torch.stack(masks).to(self.device)

    # -- generation and scoring ------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, images, instructions: list[str], temperature: float = 0.0,
                 generator: torch.Generator | None = None, uniforms: np.ndarray | None = None) -> ActionQuery:
        """Generate the action tokens of a whole batch with one KV cache (greedy when temperature is 0;
        the cache and decode steps as `set_decoding` chose).

        Sampling draws from `generator`, or, when `uniforms` (B, 7) in [0, 1) are given, picks each
        token by inverse CDF from its row's uniform: a row's sample then depends only on its own
        noise, whatever else is in the batch (rollouts give each episode its own RNG this way).
        """
        if uniforms is not None:
            uniforms = torch.as_tensor(np.asarray(uniforms), dtype=torch.float64, device=self.device)
            if uniforms.shape != (len(instructions), self.config.num_action_tokens):
                raise ValueError(f"uniforms have shape {tuple(uniforms.shape)}; expected "
                                 f"({len(instructions)}, {self.config.num_action_tokens})")
        embeds, mask = self.prefix(images, instructions)
        n = self.config.num_action_tokens
        decoding = self._decoders[self.decoding].begin(self.llm, embeds, mask, n)
        logits = decoding.logits
        tokens, log_probs = [], []
        for step in range(n):
            logits = logits.float()
            scaled = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
            if temperature > 0 and uniforms is not None:
                cdf = scaled.double().exp().cumsum(-1)
                token = torch.searchsorted(cdf, uniforms[:, step:step + 1] * cdf[:, -1:])[:, 0]
                token = token.clamp(max=cdf.shape[1] - 1)
            elif temperature > 0:
                token = torch.multinomial(scaled.exp(), 1, generator=generator)[:, 0]
            else:
                token = logits.argmax(-1)
            tokens.append(token)
            log_probs.append(scaled.gather(-1, token[:, None])[:, 0])
            if step + 1 < n:
                logits = decoding.advance(token)
        token_ids = torch.stack(tokens, dim=1)
        return self.decode_tokens(token_ids, torch.stack(log_probs, dim=1))

    def forward(self, images, instructions: list[str], targets: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits of `targets`: the training entry point (DDP and FSDP hook `forward`)."""
        return self.target_logits(images, instructions, targets)

    def target_logits(self, images, instructions: list[str], targets: torch.Tensor) -> torch.Tensor:
        """Logits (B, n, vocab) predicting each of n given target tokens after the prompt (teacher forcing)."""
        targets = torch.as_tensor(targets, device=self.device)
        n = targets.shape[1]
        embeds, mask = self.prefix(images, instructions)
        embeds = torch.cat([embeds, self.llm.get_input_embeddings()(targets[:, :-1])], dim=1)
        mask = torch.cat([mask, mask.new_ones(len(mask), n - 1)], dim=1)
        return self.llm(inputs_embeds=embeds, attention_mask=mask, position_ids=prompt_positions(mask), use_cache=False,
                        logits_to_keep=n).logits

    def score(self, images, instructions: list[str], token_ids: torch.Tensor,
              temperature: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies (B, 7) of given action tokens in one forward pass (differentiable).

        Uses the same distribution as `generate` with this temperature, so for the same weights and
        inputs the log-probs equal the generation-time ones.
        """
        token_ids = torch.as_tensor(token_ids, device=self.device)
        n = self.config.num_action_tokens
        if token_ids.shape != (len(instructions), n):
            raise ValueError(f"token_ids have shape {tuple(token_ids.shape)}; expected ({len(instructions)}, {n})")
        logits = self(images, instructions, token_ids)
        scaled = torch.log_softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
        log_probs = scaled.gather(-1, token_ids[..., None])[..., 0]
        entropy = -(scaled.exp() * scaled).sum(-1)
        return log_probs, entropy

    def sft_targets(self, chunks: torch.Tensor) -> torch.Tensor:
        """Normalised chunks → training targets: the 7 action tokens, then <|im_end|><|endoftext|>."""
        codes = self.action_tokenizer.encode(chunks.cpu())
        ends = torch.tensor(self.tokenizer.convert_tokens_to_ids(list(END_TOKENS))).expand(len(codes), -1)
        return torch.cat([self.vocab_len - 1 - codes, ends], dim=1).to(self.device)

    def decode_tokens(self, token_ids: torch.Tensor, log_probs: torch.Tensor) -> ActionQuery:
        """Token ids → VQ codes (clipped into the codebook, as MiniVLA does) → chunks → env actions."""
        codes = (self.vocab_len - 1 - token_ids.cpu()).clamp(0, self.config.codebook_size - 1)
        normalized = self.action_tokenizer.decode(codes).numpy().astype(np.float64)
        actions = None
        if self.statistics is not None:
            actions = self.statistics.unnormalize(normalized)
            if self.config.gripper_convention == "libero":
                actions[..., -1] = gripper_to_env(actions[..., -1])
        return ActionQuery(token_ids, log_probs, codes, normalized, actions)
