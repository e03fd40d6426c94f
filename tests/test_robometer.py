"""The Robometer scorer on a tiny random Qwen3-VL written to disk in the published layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from world_models.registry import make_scorer
from world_models.robometer import ADDED_TOKENS, PROMPT, head

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
           "<|video_pad|>"]
# Qwen3-VL's template as Robometer renders it: user turn, "Picture i: " before each image, no generation prompt
CHAT = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
        "{%- set image_count = namespace(value=0) %}{%- for content in message.content %}"
        "{%- if content.type == 'image' %}{%- set image_count.value = image_count.value + 1 %}"
        "{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}"
        "<|vision_start|><|image_pad|><|vision_end|>{%- elif 'text' in content %}{{- content.text }}{%- endif %}"
        "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def tiny_qwen3_vl_processor(directory):
    """A word-level tokenizer with Qwen's special tokens and Qwen3-VL's image processor settings."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    words = ["[UNK]"] + sorted(set(PROMPT.lower().replace(",", " , ").replace(".", " . ").split()) | {"picture", ":"})
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="<|endoftext|>",
                                        eos_token="<|im_end|>", additional_special_tokens=SPECIAL)
    images = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                   image_std=[0.5] * 3)
    Qwen3VLProcessor(image_processor=images, tokenizer=tokenizer, video_processor=Qwen3VLVideoProcessor(),
                     chat_template=CHAT).save_pretrained(directory)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A tiny random Robometer in the Hub layout: a Qwen3VLConfig (architectures RFM), two safetensors
    shards with an index, keys model.* / progress_head.* / success_head.* / preference_head.* / frame_pool_attn."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLModel

    root = tmp_path_factory.mktemp("robometer")
    tiny_qwen3_vl_processor(root / "qwen3-vl")
    tokenizer = AutoTokenizer.from_pretrained(root / "qwen3-vl")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL}
    torch.manual_seed(0)
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=len(tokenizer) + len(ADDED_TOKENS), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [4, 2, 2],
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=256,
                           deepstack_visual_indexes=[0]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    model_dir = root / "robometer-4b-fft-libero"
    config.architectures = ["RFM"]
    config.save_pretrained(model_dir)
    state = {f"model.{k}": v for k, v in Qwen3VLModel(config).state_dict().items()}
    for name, out in (("progress_head", 10), ("success_head", 1), ("preference_head", 1)):
        state |= {f"{name}.{k}": torch.randn_like(v) for k, v in head(64, out).state_dict().items()}
    state["frame_pool_attn.weight"] = torch.randn(1, 64)
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for file, names in shards.items():
        save_file({k: state[k].contiguous() for k in names}, model_dir / file, metadata={"format": "pt"})
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: file for file, names in shards.items() for k in names}}))
    return model_dir, root / "qwen3-vl", state


def reference(state, processor_dir, frames: np.ndarray, instruction: str):
    """Robometer's computation written out by hand: the prompt with each <|image_pad|> expanded to the
    frame's merged patch count, mm_token_type_ids, the last hidden state at each <|prog_token|>."""
    from PIL import Image
    from transformers import AutoConfig, AutoProcessor, Qwen3VLModel

    processor = AutoProcessor.from_pretrained(processor_dir)
    tokenizer = processor.tokenizer
    tokenizer.add_special_tokens({"additional_special_tokens": list(ADDED_TOKENS)}, replace_extra_special_tokens=False)
    model = Qwen3VLModel(AutoConfig.from_pretrained(processor_dir.parent / "robometer-4b-fft-libero")).eval()
    model.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("model.")})
    progress_head, success_head = head(64, 10).eval(), head(64, 1).eval()
    progress_head.load_state_dict({k[14:]: v for k, v in state.items() if k.startswith("progress_head.")})
    success_head.load_state_dict({k[13:]: v for k, v in state.items() if k.startswith("success_head.")})
    images = [Image.fromarray(f) for f in frames]
    pixels = processor.image_processor(images=images, do_resize=False, return_tensors="pt")
    patches = (pixels["image_grid_thw"].prod(-1) // 4).tolist()
    text = "<|im_start|>user\n" + PROMPT.format(task=instruction) + "".join(
        f"Picture {i + 1}: <|vision_start|>" + "<|image_pad|>" * n + "<|vision_end|><|prog_token|>"
        for i, n in enumerate(patches)) + "<|im_end|>\n"
    inputs = dict(tokenizer([text], return_tensors="pt"), **pixels)
    inputs["mm_token_type_ids"] = (inputs["input_ids"] == model.config.image_token_id).long()
    with torch.no_grad():
        hidden = model(**inputs, use_cache=False).last_hidden_state[0]
        tokens = hidden[inputs["input_ids"][0] == tokenizer.convert_tokens_to_ids("<|prog_token|>")]
        progress = (progress_head(tokens).softmax(-1) * torch.linspace(0, 1, 10)).sum(-1)
        return progress.numpy(), torch.sigmoid(success_head(tokens[-1])).item()


def test_robometer_scores_as_the_published_model_computes(published):
    model_dir, processor_dir, state = published
    scorer = make_scorer("robometer", path=str(model_dir), processor=str(processor_dir), dtype="float32")
    rng = np.random.default_rng(0)
    trajectories = [rng.integers(0, 255, (30, 64, 64, 3), dtype=np.uint8),
                    rng.integers(0, 255, (5, 64, 64, 3), dtype=np.uint8)]  # short: its last frame repeats
    instructions = ["pick up the bowl", "open the drawer"]
    prediction = scorer.predict_trajectories(trajectories, instructions)
    assert prediction.progress.shape == (2, 8) and prediction.success.shape == (2,)
    assert np.all((prediction.progress >= 0) & (prediction.progress <= 1))
    picks = [np.rint(np.linspace(0, 29, 8)).astype(int), np.r_[0, 1, 2, 3, 4, 4, 4, 4]]
    for i, (frames, instruction) in enumerate(zip(trajectories, instructions)):
        progress, success = reference(state, processor_dir, frames[picks[i]], instruction)
        np.testing.assert_allclose(prediction.progress[i], progress, atol=1e-5)
        assert prediction.success[i] == pytest.approx(success, abs=1e-5)
    scores = scorer.score(trajectories, instructions, mode="potential", k=3)  # WMRL's reduction
    np.testing.assert_allclose(scores, prediction.progress[:, -3:].mean(1) - prediction.progress[:, :3].mean(1))


def test_a_wrong_directory_or_tokenizer_is_named(published, tmp_path):
    model_dir, processor_dir, _ = published
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        make_scorer("robometer", path=str(tmp_path))
    with pytest.raises(ValueError, match="unknown option"):
        make_scorer("robometer", path=str(model_dir), frames=8)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text((model_dir / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="neither model.safetensors.index.json nor model.safetensors"):
        make_scorer("robometer", path=str(tmp_path / "other"), processor=str(processor_dir))
