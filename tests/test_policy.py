"""MiniVLA at a tiny size with the real timm ViT and transformers Qwen2 classes."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from minivla_wmrl.policy import MiniVLA, preset
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer, ActionTokenizerConfig
from minivla_wmrl.policy.prismatic import import_prismatic
from minivla_wmrl.policy.tokenizer import build_prompt, tiny_qwen_style_tokenizer
from tests.tiny_policy import make_policy

INSTRUCTIONS = ["Close the top drawer of the cabinet", "put the bowl on the plate", "turn on the stove"]


@pytest.fixture(scope="module")
def policy():
    return make_policy()


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(1).integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)


def test_prompt_is_the_qwen_chat_format():
    assert build_prompt("Close The Drawer") == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat action should the robot take to close the drawer?<|im_end|>\n<|im_start|>assistant\n")


def test_patches_are_inserted_after_the_first_token(policy, images):
    embeds, mask = policy.prefix(images[:1], INSTRUCTIONS[:1])
    prompt = policy.tokenizer(build_prompt(INSTRUCTIONS[0]), add_special_tokens=False).input_ids
    table = policy.llm.get_input_embeddings().weight
    assert embeds.shape[1] == len(prompt) + 256 and mask.all()
    torch.testing.assert_close(embeds[0, 0], table[prompt[0]])
    torch.testing.assert_close(embeds[0, 1:257], policy.embed_images(images[:1])[0])
    torch.testing.assert_close(embeds[0, 257], table[prompt[1]])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_and_scoring_log_probs_agree(policy, images, temperature):
    generator = torch.Generator().manual_seed(0)
    query = policy.generate(images, INSTRUCTIONS, temperature=temperature, generator=generator)
    assert query.token_ids.shape == (3, 7) and query.log_probs.shape == (3, 7)
    log_probs, entropy = policy.score(images, INSTRUCTIONS, query.token_ids, temperature=temperature)
    torch.testing.assert_close(log_probs, query.log_probs, atol=1e-5, rtol=0)
    assert (entropy > 0).all() and (log_probs <= 0).all()


def test_batched_generation_equals_one_env_at_a_time(policy, images):
    batched = policy.generate(images, INSTRUCTIONS)
    for i in range(3):
        single = policy.generate(images[i:i + 1], INSTRUCTIONS[i:i + 1])
        assert torch.equal(single.token_ids[0], batched.token_ids[i])
        torch.testing.assert_close(single.log_probs[0], batched.log_probs[i], atol=1e-5, rtol=0)


@pytest.mark.parametrize("decoding", ["static", "compiled"])
def test_static_and_compiled_decoding_give_the_dynamic_caches_tokens(decoding):
    """Batches that share a bucket (7 then 5 rows, prompts of different lengths), one in a smaller
    bucket (3), greedy and per-row uniforms, and a LoRA-wrapped language model: the same tokens as the
    dynamic cache, the same log-probs to float precision; a bucket's buffers are reused, not rebuilt."""
    policy = make_policy(seed=4)
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (7, 224, 224, 3), dtype=np.uint8)
    instructions = [INSTRUCTIONS[i % 3] for i in range(7)]
    uniforms = rng.random((7, 7))

    def queries(rows: list[int]):
        return (policy.generate(images[rows], [instructions[i] for i in rows]),
                policy.generate(images[rows], [instructions[i] for i in rows], temperature=1.0,
                                uniforms=uniforms[rows]))

    # [1, 2, 4, 5, 2]: the bucket of the first batch, without its longest prompt; [1, 2, 4]: a smaller bucket
    batches = [list(range(7)), [1, 2, 4, 5, 2], [1, 2, 4]]
    for lora in (False, True):
        if lora:
            policy.add_lora(r=4, alpha=8)
            with torch.no_grad():
                for name, parameter in policy.llm.named_parameters():
                    if "lora_B" in name:
                        parameter.normal_(std=0.5)
        policy.set_decoding("dynamic")
        expected = [queries(rows) for rows in batches]
        policy.set_decoding(decoding)
        for rows, reference in zip(batches, expected):
            for query, exact in zip(queries(rows), reference):
                assert torch.equal(query.token_ids, exact.token_ids), (decoding, lora, rows)
                torch.testing.assert_close(query.log_probs, exact.log_probs, atol=1e-5, rtol=0)
        buckets = policy._decoders[decoding].buckets
        assert sorted(key[0] for key in buckets) == [4, 8]  # with the adapters too: the same buffers


def test_attention_runs_in_fused_kernels(policy):
    """Both ViTs and the language model call torch's scaled_dot_product_attention (flash or
    memory-efficient kernels on CUDA), not an eager softmax(QK^T)V."""
    assert policy.llm.config._attn_implementation == "sdpa"
    for vit in (policy.vision.dino_featurizer, policy.vision.siglip_featurizer):
        assert all(block.attn.fused_attn for block in vit.blocks)


def test_static_decoding_in_bfloat16_gives_the_dynamic_caches_tokens(images):
    """Greedy, after the policy was cast from float32: its float32 buffers are freed, not kept beside."""
    policy = make_policy(seed=3)
    policy.set_decoding("static")
    policy.generate(images, INSTRUCTIONS)
    policy.to(torch.bfloat16).set_decoding("dynamic")
    exact = policy.generate(images, INSTRUCTIONS)
    policy.set_decoding("static")
    query = policy.generate(images, INSTRUCTIONS)
    assert torch.equal(query.token_ids, exact.token_ids)
    torch.testing.assert_close(query.log_probs, exact.log_probs, atol=1e-2, rtol=0)
    assert [key[2] for key in policy._decoders["static"].buckets] == [torch.bfloat16]
    with pytest.raises(ValueError, match="decoding 'graphs': expected one of"):
        policy.set_decoding("graphs")


def test_tokens_decode_to_unnormalised_env_actions(policy):
    codes = torch.tensor([[0, 1, 2, 3, 4, 5, 127]])
    token_ids = policy.vocab_len - 1 - codes
    query = policy.decode_tokens(token_ids, torch.zeros(1, 7))
    assert torch.equal(query.codes, codes)
    expected = policy.action_tokenizer.decode(codes).numpy()
    np.testing.assert_allclose(query.normalized_chunks, expected, rtol=1e-6)
    np.testing.assert_allclose(query.actions[..., :6], policy.statistics.unnormalize(expected)[..., :6], rtol=1e-6)
    assert set(np.unique(query.actions[..., 6])) <= {-1.0, 1.0}
    assert query.actions.shape == (1, 8, 7)


def test_lora_trains_only_the_adapters(images):
    policy = make_policy(seed=2)
    policy.configure_training(lora=True, lora_r=4, lora_alpha=8, freeze_vision=True)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[1] for n in trainable} == targets
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1.0)
    query = policy.generate(images, INSTRUCTIONS)
    log_probs, _ = policy.score(images, INSTRUCTIONS, query.token_ids)
    (-log_probs.mean()).backward()
    optimizer.step()
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= set(trainable)


def test_fresh_adapters_merge_the_old_ones_so_disabling_them_gives_the_start_policy(images):
    policy = make_policy(seed=6)
    policy.add_lora(r=4, alpha=8)
    with torch.no_grad():
        for name, parameter in policy.llm.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)  # a LoRA-fine-tuned policy
    tokens = policy.generate(images, INSTRUCTIONS).token_ids
    tuned, _ = policy.score(images, INSTRUCTIONS, tokens)
    policy.configure_training(lora=True, lora_r=4, lora_alpha=8, freeze_vision=True, fresh_adapters=True)
    with policy.llm.disable_adapter():
        reference, _ = policy.score(images, INSTRUCTIONS, tokens)
    torch.testing.assert_close(reference, tuned, atol=1e-5, rtol=1e-5)
    assert not any(p.requires_grad for p in policy.projector.parameters())


def test_bfloat16_generation_agrees_with_float32(images):
    full, half = make_policy(seed=3), make_policy(seed=3).to(torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())
    exact, query = full.generate(images[:2], INSTRUCTIONS[:2]), half.generate(images[:2], INSTRUCTIONS[:2])
    assert query.token_ids.shape == (2, 7) and torch.equal(query.token_ids, exact.token_ids)  # same greedy tokens
    assert np.array_equal(query.actions, exact.actions)
    # bfloat16 keeps ~3 significant digits: the tokens' log-probabilities agree to within 0.02 nats
    assert torch.allclose(query.log_probs.float(), exact.log_probs, atol=0.02)


@pytest.mark.parametrize("lora", [False, True])
def test_save_and_load_reproduce_outputs_exactly(images, tmp_path, lora):
    policy = make_policy(seed=4)
    if lora:
        policy.add_lora(r=4, alpha=8)
        with torch.no_grad():
            for name, parameter in policy.llm.named_parameters():
                if "lora_B" in name:
                    parameter.normal_()  # non-zero adapters, so saving them matters
    policy.save_pretrained(tmp_path / "ckpt")
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {
        "config.json", "model.safetensors", "tokenizer", "action_tokenizer", "dataset_statistics.json", "README.md",
        ".minivla-wmrl.json"}  # the mark that lets a later save replace it (minivla_wmrl.infra.outputs)
    loaded = MiniVLA.from_pretrained(tmp_path / "ckpt")
    a, b = policy.generate(images, INSTRUCTIONS), loaded.generate(images, INSTRUCTIONS)
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.log_probs, b.log_probs)
    np.testing.assert_array_equal(a.actions, b.actions)


def prismatic_config(image_aug: bool = False, **vla) -> dict:
    """A run's config.json as openvla-mini's train.py dumps it (the fields that matter here)."""
    return {"vla": {"type": "prism-qwen25-dinosiglip-224px+0_5b+mx-libero-90",
                    "base_vlm": "prism-qwen25-extra-dinosiglip-224px+0_5b",
                    "action_tokenizer": "libero_vq_extra_action_tokenizer", "image_sequence_len": 1,
                    "use_wrist_image": False, **vla},
            "image_aug": image_aug, "run_id": "minivla-libero90"}


def write_prismatic_run(policy: MiniVLA, root):
    """A Prismatic run directory, VQ folder and Qwen tokenizer directory with the real key layouts."""
    run, vq, qwen = root / "run", root / "vq", root / "qwen"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(prismatic_config()))
    (run / "dataset_statistics.json").write_text(json.dumps({"libero_90": policy.statistics.to_json()}))
    model = {"vision_backbone": policy.vision.state_dict(), "projector": policy.projector.state_dict(),
             "llm_backbone": {f"llm.{k}": v for k, v in policy.llm.state_dict().items()}}
    torch.save({"model": model}, run / "checkpoints" / "step-010000-epoch-01-loss=0.1234.pt")
    c = policy.action_tokenizer.config
    (vq / "checkpoints").mkdir(parents=True)
    (vq / "config.json").write_text(json.dumps({"input_dim_w": c.action_dim, "input_dim_h": c.chunk_len,
                                                "n_latent_dims": c.latent_dim, "vqvae_n_embed": c.codebook_size,
                                                "vqvae_groups": c.num_codebooks}))
    state = policy.action_tokenizer.state_dict()
    part = lambda prefix: {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}  # noqa: E731
    torch.save({"encoder": part("encoder."), "decoder": part("decoder."), "vq_embedding": part("vq."), "optimizer": {}},
               vq / "checkpoints" / "model.pt")
    policy.tokenizer.save_pretrained(qwen)
    return run, vq, qwen, model


def test_prismatic_import_reproduces_outputs_exactly(policy, images, tmp_path):
    run, vq, qwen, model = write_prismatic_run(policy, tmp_path)
    assert any(k.startswith("dino_featurizer.") for k in model["vision_backbone"])
    assert any(k.startswith("siglip_featurizer.") for k in model["vision_backbone"])
    assert set(model["projector"]) == {f"projector.{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")}
    assert "llm.lm_head.weight" in model["llm_backbone"] and "llm.model.embed_tokens.weight" in model["llm_backbone"]
    imported = import_prismatic(run, vq, qwen, preset_name="tiny")
    a, b = policy.generate(images, INSTRUCTIONS), imported.generate(images, INSTRUCTIONS)
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.log_probs, b.log_probs)
    np.testing.assert_array_equal(a.actions, b.actions)


def test_prismatic_variants_are_read_from_the_run_config(policy, images, tmp_path):
    from minivla_wmrl.policy.minivla import center_crop

    run, vq, qwen, _ = write_prismatic_run(policy, tmp_path)
    for vla, message in (({"action_tokenizer": "extra_action_tokenizer"}, "binning MiniVLA"),
                         ({"image_sequence_len": 2}, "image_sequence_len 2 is the image-history variant"),
                         ({"image_sequence_len": 2, "use_wrist_image": True}, "image-history"),
                         ({"use_wrist_image": True}, "wrist-camera variant")):
        (run / "config.json").write_text(json.dumps(prismatic_config(**vla)))
        with pytest.raises(ValueError, match=message):
            import_prismatic(run, vq, qwen, preset_name="tiny")
    # a run trained with image augmentation is run on centre crops: openvla-mini's eval transform
    (run / "config.json").write_text(json.dumps(prismatic_config(image_aug=True)))
    cropped = import_prismatic(run, vq, qwen, preset_name="tiny")
    assert (cropped.config.center_crop
            and not import_prismatic(run, vq, qwen, "tiny", center_crop=False).config.center_crop)
    reference = np.stack([np.asarray(Image.fromarray(image[6:218, 6:218]).resize((224, 224), Image.Resampling.BILINEAR))
                          for image in images])  # side int(sqrt(0.9) * 224) = 212, offset 6
    np.testing.assert_array_equal(center_crop(images), reference)
    a, b = cropped.generate(images, INSTRUCTIONS), policy.generate(reference, INSTRUCTIONS)
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.log_probs, b.log_probs)
    assert import_prismatic(run, vq, qwen, "tiny", dtype=torch.bfloat16).dtype == torch.bfloat16


def test_prismatic_import_of_the_wrong_preset_is_named(policy, tmp_path):
    run, vq, qwen, _ = write_prismatic_run(policy, tmp_path)
    with pytest.raises(ValueError, match="model.vision_backbone does not fit preset 'small'"):
        import_prismatic(run, vq, qwen, preset_name="small")


def test_bad_policy_inputs_are_named(policy, images):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")))
    with pytest.raises(ValueError, match="lacks the action tokens"):
        MiniVLA(preset("tiny"), bare, ActionTokenizer())
    small_vq = ActionTokenizer(ActionTokenizerConfig(num_codebooks=5))
    with pytest.raises(ValueError, match="action tokenizer has 5 codebooks x 128 codes; the policy expects 7 x 128"):
        MiniVLA(preset("tiny"), tiny_qwen_style_tokenizer(), small_vq)
    with pytest.raises(ValueError, match=r"images have shape \(1, 256, 256, 3\) "
                                         r".* expected uint8 \(batch, 224, 224, 3\)"):
        policy.generate(np.zeros((1, 256, 256, 3), np.uint8), INSTRUCTIONS[:1])
    with pytest.raises(ValueError, match="dtype torch.float32"):
        policy.generate(np.zeros((1, 224, 224, 3), np.float32), INSTRUCTIONS[:1])
    with pytest.raises(ValueError, match=r"token_ids have shape \(3, 6\); expected \(3, 7\)"):
        policy.score(images, INSTRUCTIONS, torch.zeros(3, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown policy preset 'huge'"):
        preset("huge")


def test_model_info_reports_the_published_sizes():
    done = subprocess.run([sys.executable, "-m", "minivla_wmrl.cli", "model-info", "--preset", "minivla-1b", "--json"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert abs(counts["total"] - 1.25e9) / 1.25e9 < 0.02
    assert abs(counts["dino"] - 303e6) / 303e6 < 0.01 and abs(counts["siglip"] - 428e6) / 428e6 < 0.01
    assert abs(counts["projector"] - 27.6e6) / 27.6e6 < 0.01 and abs(counts["language_model"] - 494e6) / 494e6 < 0.01
    assert counts["fused_vision_dim"] == 2176 and counts["visual_tokens"] == 256


def run_bench(tmp_path, *args: str) -> tuple[dict, str]:
    """`minivla-wmrl bench ARGS --json FILE` in a subprocess: the JSON it wrote and what it printed."""
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "minivla_wmrl.cli", "bench", *args, "--json", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text()), done.stdout


def test_bench_policy_measures_both_loops(tmp_path):
    result, printed = run_bench(tmp_path, "policy", "--preset", "tiny", "--batch", "8", "--repeats", "1",
                                "--naive-queries", "2", "--decoding", "static")
    assert result["ratio"] == pytest.approx(result["batched_queries_per_s"] / result["naive_queries_per_s"])
    static = result["decodings"]["static"]
    assert set(result["decodings"]) == {"dynamic", "static"} and static["token_agreement"] == 1.0  # float32
    assert "static decoding (100.0% of tokens as the dynamic cache's)" in printed
    assert static["vs_dynamic"] == pytest.approx(static["queries_per_s"] / result["batched_queries_per_s"])
    assert set(result["stage_seconds"]) == {"vision_and_projector", "prefill", "decode_steps"}
    assert all(seconds > 0 for seconds in result["stage_seconds"].values())
    best = result["decodings"][result["best_decoding"]]["queries_per_s"]
    assert best == max(d["queries_per_s"] for d in result["decodings"].values())
    assert result["achieved_tflops"] == pytest.approx(result["tflop_per_query"] * best)
    assert result["peak_tflops"] is None and result["fraction_of_peak"] is None  # a CPU: no known peak


def test_the_bench_compares_tokens_exactly_in_float32_and_up_to_rounding_in_bfloat16():
    from minivla_wmrl.bench.policy import same_work

    reference = torch.arange(100)
    one_off = reference.clone()
    one_off[0] = -1
    assert same_work("static decoding", reference, reference, "float32") == 1.0
    assert same_work("compiled decoding", one_off, reference, "bfloat16") == pytest.approx(0.99)
    with pytest.raises(RuntimeError, match=r"compiled decoding gave other tokens .*99.0% agree; 100% required"):
        same_work("compiled decoding", one_off, reference, "float32")
    with pytest.raises(RuntimeError, match="90.0% agree; 95% required in bfloat16"):
        same_work("compiled decoding", torch.where(reference < 10, -1, reference), reference, "bfloat16")


def test_generation_flops_are_counted_per_query_whatever_the_batch():
    """The count covers the whole call (vision, prefill, the cached decode steps): per query it does not
    depend on the batch, and it exceeds one multiply-add per vision weight per patch."""
    from minivla_wmrl.bench.policy import generation_flops

    torch.manual_seed(0)
    policy = MiniVLA(preset("tiny"), tiny_qwen_style_tokenizer(), ActionTokenizer()).eval()
    images = np.random.default_rng(0).integers(0, 256, (6, 224, 224, 3), dtype=np.uint8)
    instructions = [INSTRUCTIONS[i % 3] for i in range(6)]
    per_query = [generation_flops(policy, images[:n], instructions[:n]) / n for n in (3, 6)]
    assert per_query[0] == per_query[1]
    patches = policy.embed_images(images[:1]).shape[1]  # every vision weight matrix multiplies every patch
    vision = sum(p.numel() for name, p in policy.named_parameters() if name.startswith("vision") and p.dim() > 1)
    assert per_query[0] > 2 * vision * patches


def test_two_images_give_512_visual_tokens():
    from minivla_wmrl.policy.config import MiniVLAConfig

    torch.manual_seed(5)
    config = MiniVLAConfig.from_dict(preset("tiny").to_dict() | {"num_images": 2})
    policy = MiniVLA(config, tiny_qwen_style_tokenizer(), ActionTokenizer()).eval()
    pair = np.random.default_rng(2).integers(0, 256, (2, 2, 224, 224, 3), dtype=np.uint8)  # agent view + wrist
    assert policy.embed_images(pair).shape[1] == 512
    query = policy.generate(pair, INSTRUCTIONS[:2])
    log_probs, _ = policy.score(pair, INSTRUCTIONS[:2], query.token_ids)
    torch.testing.assert_close(log_probs, query.log_probs, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"expected uint8 \(batch, 2, 224, 224, 3\)"):
        policy.generate(pair[:, 0], INSTRUCTIONS[:2])


def test_a_run_built_from_the_reference_modules_computes_as_the_reference(policy, images, tmp_path):
    """A Prismatic checkpoint whose parts come from modules built the way openvla-mini builds them
    (timm ViTs with num_classes=0, its fused GELU MLP as a Sequential, transformers' Qwen2 under
    `llm.`), not from ours: imported, the features equal the reference's featurizer (each ViT's
    second-to-last block via get_intermediate_layers, prefix tokens dropped, DINOv2 on ImageNet
    statistics and SigLIP on 0.5/0.5, concatenated DINOv2 first), and so do projector and LM."""
    import timm
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = preset("tiny")
    torch.manual_seed(3)
    dino = timm.create_model(config.dino, pretrained=False, num_classes=0, img_size=224, **config.dino_overrides).eval()
    siglip = timm.create_model(config.siglip, pretrained=False, num_classes=0, img_size=224,
                               **config.siglip_overrides).eval()
    fused = dino.embed_dim + siglip.embed_dim
    llm_dim = config.llm["hidden_size"]
    projector = torch.nn.Sequential(torch.nn.Linear(fused, 4 * fused), torch.nn.GELU(),
                                    torch.nn.Linear(4 * fused, llm_dim), torch.nn.GELU(),
                                    torch.nn.Linear(llm_dim, llm_dim)).eval()
    llm = Qwen2ForCausalLM(Qwen2Config(**config.llm)).eval()
    run, vq, qwen, _ = write_prismatic_run(policy, tmp_path)
    model = {"vision_backbone": {**{f"dino_featurizer.{k}": v for k, v in dino.state_dict().items()},
                                 **{f"siglip_featurizer.{k}": v for k, v in siglip.state_dict().items()}},
             "projector": {f"projector.{k}": v for k, v in projector.state_dict().items()},
             "llm_backbone": {f"llm.{k}": v for k, v in llm.state_dict().items()}}
    torch.save({"model": model}, next((run / "checkpoints").glob("*.pt")))
    imported = import_prismatic(run, vq, qwen, preset_name="tiny")

    pixels = torch.as_tensor(images).permute(0, 3, 1, 2).float() / 255
    mean, std = (torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1),
                 torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))
    with torch.no_grad():
        patches = torch.cat([dino.get_intermediate_layers((pixels - mean) / std, n={len(dino.blocks) - 2})[0],
                             siglip.get_intermediate_layers((pixels - 0.5) / 0.5, n={len(siglip.blocks) - 2})[0]],
                            dim=2)
        torch.testing.assert_close(imported.vision(pixels), patches)
        torch.testing.assert_close(imported.projector(patches), projector(patches))
        ids = torch.tensor([[1, 5, 9, 200, 300]])
        torch.testing.assert_close(imported.llm(input_ids=ids).logits, llm(input_ids=ids).logits)


def test_vision_features_are_prismatics_second_to_last_block_without_running_the_last():
    vision = make_policy(seed=9).vision
    pixels = torch.rand(2, 3, 224, 224)
    calls = []
    last_block = vision.dino_featurizer.blocks[-1]
    handle = last_block.register_forward_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        features = vision(pixels)
        handle.remove()
        prismatic = [vit.get_intermediate_layers(x, n=[len(vit.blocks) - 2])[0] for vit, x in (
            (vision.dino_featurizer, (pixels - vision.dino_mean) / vision.dino_std),
            (vision.siglip_featurizer, (pixels - 0.5) / 0.5))]
    assert torch.equal(features, torch.cat(prismatic, dim=-1))
    assert not calls  # the last block's output is never used, so it is not computed


@pytest.mark.parametrize("lora", [False, True], ids=["full fine-tune", "LoRA, frozen vision"])
def test_activation_checkpointing_recomputes_blocks_and_leaves_gradients_unchanged(lora):
    """SFT's full fine-tune and GRPO's LoRA setting: with checkpointing, a ViT block and an LM layer run
    again in the backward pass (that is what saves their activations), and every gradient is the same."""
    images = np.random.default_rng(0).integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)
    targets = torch.randint(0, 50, (3, 9))
    grads, calls = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        policy = MiniVLA(preset("tiny"), tiny_qwen_style_tokenizer(), ActionTokenizer())
        policy.configure_training(lora=lora, freeze_vision=lora)
        policy.set_activation_checkpointing(checkpointing)
        policy.train()
        counted = {"vit": 0, "llm": 0}
        count = lambda key: lambda *_: counted.__setitem__(key, counted[key] + 1)  # noqa: E731
        policy.vision.dino_featurizer.blocks[0].register_forward_pre_hook(count("vit"))
        # pre-hooks: a recompute stops once it has what backward needs, before a module returns; and
        # transformers checkpoints a layer's forward, not its call, so a sub-module's call shows it
        llm = policy.llm.get_base_model() if lora else policy.llm
        llm.model.layers[0].mlp.register_forward_pre_hook(count("llm"))
        tokens = policy.vocab_len - 1 - targets
        logits = policy.target_logits(images, INSTRUCTIONS, tokens)
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1)).backward()
        grads.append({n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None})
        calls.append(counted)
    assert calls[0] == {"vit": 1, "llm": 1}
    assert calls[1] == {"vit": 1 if lora else 2, "llm": 2}  # frozen vision needs no backward, so no recompute
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7, msg=name)


def test_bench_train_memory_measures_both_steps_on_the_same_work(tmp_path):
    result, printed = run_bench(tmp_path, "train-memory", "--preset", "tiny", "--batch", "2", "--setting", "grpo",
                                "--lora-r", "4")
    assert result["setting"] == "grpo" and result["measure"] == "peak resident set (ru_maxrss)"
    assert result["peak_mb"] > 100 and result["peak_mb_checkpointing"] > 100  # an interpreter with torch, at least
    assert result["ratio"] == pytest.approx(result["peak_mb"] / result["peak_mb_checkpointing"])
    assert "the same loss" in printed


def test_bench_train_memory_takes_the_products_update_from_a_recipe(tmp_path):
    """--recipe: the GRPO update as the recipe sets it (its minibatch, LoRA rank, preset), not the flags'."""
    result, printed = run_bench(tmp_path, "train-memory", "--recipe", "recipes/rl_cpu.yaml", "--setting", "grpo")
    assert (result["preset"], result["batch"], result["lora_r"], result["lora_alpha"]) == ("tiny", 32, 16, 32)
    assert result["failed"] is None and "grpo step, policy tiny, batch 32" in printed
    done = subprocess.run([sys.executable, "-m", "minivla_wmrl.cli", "bench", "train-memory", "--recipe",
                           "recipes/rl_cpu.yaml", "--batch", "4"], capture_output=True, text=True)
    assert done.returncode != 0 and "--batch would contradict it" in done.stderr
