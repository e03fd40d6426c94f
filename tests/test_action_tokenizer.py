"""The residual-VQ action tokenizer: token mapping, shapes, persistence (ours and the released layout),
and training on real action chunks recorded in the simulator."""

import json

import h5py
import numpy as np
import pytest
import torch

from minivla_wmrl.data.chunks import episode_chunks
from minivla_wmrl.data.dataset import read_episodes
from minivla_wmrl.policy.action_tokenizer import ActionTokenizer, ActionTokenizerConfig
from minivla_wmrl.train.vq import VQTrainConfig, reconstruction_l1, train_action_tokenizer

QWEN_VOCAB_WITH_EXTRAS = 151921  # Qwen2.5's 151665 tokens + 256 <|extra_*|>


@pytest.fixture(scope="module")
def expert_demo_file(libero_env, tmp_path_factory):
    """Ten scripted drawer-closing episodes from the real simulator, written as data/demo_N/actions."""
    from envs.experts import run_expert

    path = tmp_path_factory.mktemp("demos") / "close_drawer_demo.hdf5"
    with h5py.File(path, "w") as f:
        for i in range(10):
            f.create_dataset(f"data/demo_{i}/actions", data=np.stack(run_expert(libero_env, i)))
    return path


@pytest.fixture(scope="module")
def trained(expert_demo_file):
    from minivla_wmrl.policy.normalization import ActionStatistics

    episodes = [e.actions for e in read_episodes([expert_demo_file], image_key=None)]
    stats = ActionStatistics.from_actions(np.concatenate(episodes), num_trajectories=len(episodes))
    chunks = [episode_chunks(stats.normalize(e)) for e in episodes]
    train_chunks, val_chunks = np.concatenate(chunks[:8]), np.concatenate(chunks[8:])
    tokenizer, history = train_action_tokenizer(train_chunks, val_chunks, ActionTokenizerConfig(),
                                                VQTrainConfig(steps=200, batch_size=256))
    return tokenizer, history, val_chunks


@pytest.mark.simulator
def test_reconstruction_error_falls_on_real_chunks(trained):
    tokenizer, history, val_chunks = trained
    assert history[-1]["val_l1"] < 0.5 * history[0]["val_l1"]
    assert reconstruction_l1(tokenizer, torch.as_tensor(val_chunks)) == pytest.approx(history[-1]["val_l1"])


def test_code_to_token_id_mapping_matches_the_reference():
    tokenizer = ActionTokenizer()
    ids = tokenizer.codes_to_token_ids(torch.tensor([[0, 127]]), QWEN_VOCAB_WITH_EXTRAS)
    assert ids.tolist() == [[151920, 151793]]  # code 0 = <|extra_255|>, code 127 = <|extra_128|>
    assert tokenizer.token_ids_to_codes(ids, QWEN_VOCAB_WITH_EXTRAS).tolist() == [[0, 127]]
    with pytest.raises(ValueError, match="token ids outside the action range 151793..151920"):
        tokenizer.token_ids_to_codes(torch.tensor([151792]), QWEN_VOCAB_WITH_EXTRAS)


def test_batched_shapes_and_other_action_sizes():
    tokenizer = ActionTokenizer(ActionTokenizerConfig(chunk_len=4, action_dim=4, latent_dim=32, num_codebooks=3,
                                                      codebook_size=16, hidden_dim=16))
    codes = tokenizer.encode(np.random.default_rng(0).uniform(-1, 1, (5, 4, 4)))
    assert codes.shape == (5, 3) and codes.dtype == torch.long and 0 <= codes.min() and codes.max() < 16
    assert tokenizer.decode(codes).shape == (5, 4, 4)


@pytest.mark.simulator
def test_encoding_never_moves_the_codebooks(trained):
    tokenizer, _, val_chunks = trained
    before = tokenizer.vq.codebooks.clone()
    tokenizer.train()
    tokenizer.encode(val_chunks)
    tokenizer.eval()
    assert torch.equal(before, tokenizer.vq.codebooks)


@pytest.mark.simulator
def test_save_and_load_reproduce_codes_and_chunks(trained, tmp_path):
    tokenizer, _, val_chunks = trained
    tokenizer.save_pretrained(tmp_path / "vq")
    loaded = ActionTokenizer.from_pretrained(tmp_path / "vq")
    codes = tokenizer.encode(val_chunks)
    assert torch.equal(loaded.encode(val_chunks), codes)
    assert torch.equal(loaded.decode(codes), tokenizer.decode(codes))


def _write_released(tokenizer: ActionTokenizer, directory):
    """The released MiniVLA VQ folder: VQ-BeT config.json + checkpoints/model.pt."""
    c = tokenizer.config
    (directory / "checkpoints").mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({
        "input_dim_w": c.action_dim, "input_dim_h": c.chunk_len, "n_latent_dims": c.latent_dim,
        "vqvae_n_embed": c.codebook_size, "vqvae_groups": c.num_codebooks, "eval": True, "device": "cuda",
        "load_dir": "/ckpt", "encoder_loss_multiplier": 1.0, "act_scale": 1.0}))
    state = tokenizer.state_dict()
    part = lambda prefix: {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}  # noqa: E731
    torch.save({"encoder": part("encoder."), "decoder": part("decoder."), "vq_embedding": part("vq."),
                "optimizer": {}}, directory / "checkpoints" / "model.pt")


@pytest.mark.simulator
def test_released_vq_folder_loads_with_identical_outputs(trained, tmp_path):
    tokenizer, _, val_chunks = trained
    _write_released(tokenizer, tmp_path / "released")
    state = torch.load(tmp_path / "released" / "checkpoints" / "model.pt", weights_only=True)
    assert {"encoder.0.weight", "encoder.2.weight", "fc.weight"} <= set(state["encoder"])
    assert state["vq_embedding"]["layers.6._codebook.embed"].shape == (1, 128, 512)
    loaded = ActionTokenizer.from_pretrained(tmp_path / "released")
    assert torch.equal(loaded.encode(val_chunks), tokenizer.encode(val_chunks))


@pytest.mark.simulator
def test_mismatched_config_and_bad_chunks_are_named(trained, tmp_path):
    tokenizer, _, _ = trained
    _write_released(tokenizer, tmp_path / "released")
    config = json.loads((tmp_path / "released" / "config.json").read_text())
    (tmp_path / "released" / "config.json").write_text(json.dumps(config | {"vqvae_n_embed": 64}))
    with pytest.raises(ValueError, match=r"do not match its config: "
                                         r".*layers.0._codebook.embed: \(1, 128, 512\) vs config \(1, 64, 512\)"):
        ActionTokenizer.from_pretrained(tmp_path / "released")
    with pytest.raises(ValueError, match=r"action chunks have shape \(2, 7, 7\); expected \(batch, 8, 7\)"):
        tokenizer.encode(np.zeros((2, 7, 7)))
    with pytest.raises(ValueError, match="NaN"):
        tokenizer.encode(np.full((1, 8, 7), np.nan))
    with pytest.raises(ValueError, match=r"codes have shape \(1, 6\); expected \(batch, 7\)"):
        tokenizer.decode(torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown key"):
        ActionTokenizerConfig.from_dict({"chunk_len": 8, "codebooks": 7})


def test_chunk_padding_rule():
    actions = np.array([[0.5] * 6 + [1.0], [0.2] * 6 + [0.0], [0.1] * 6 + [0.0]], np.float32)
    chunks = episode_chunks(actions, chunk_len=4)
    np.testing.assert_array_equal(chunks[0, :3], actions)
    np.testing.assert_array_equal(chunks[2, 0], actions[2])
    np.testing.assert_array_equal(chunks[2, 1:, :6], 0)  # neutral motion past the episode end
    np.testing.assert_array_equal(chunks[2, 1:, 6], 0.0)  # the gripper repeats its last value
    assert chunks.shape == (3, 4, 7)


def write_vqbet_folder(directory, h=8, w=7, latent=32, n_embed=16, groups=3, act_scale=2.0, seed=0):
    """A VQ folder as VQ-BeT's `VqVae.state_dict()` and openvla-mini's `pretrain_vq.py` write it, built
    from the reference's layout, not from our modules: `EncoderMLP` keys (`encoder.0`, `encoder.2`,
    `fc`), its vendored ResidualVQ's four buffers per layer (`initted` a float of shape (1,),
    `cluster_size` (1, K), `embed_avg` and `embed` (1, K, D)), the MLPs' Adam state, and the
    config.json keys of pretrain_vq.py."""
    g = torch.Generator().manual_seed(seed)

    def mlp(n_in, n_out):
        shapes = {"encoder.0.weight": (128, n_in), "encoder.0.bias": (128,), "encoder.2.weight": (128, 128),
                  "encoder.2.bias": (128,), "fc.weight": (n_out, 128), "fc.bias": (n_out,)}
        return {k: torch.randn(s, generator=g) / np.sqrt(s[-1]) for k, s in shapes.items()}

    encoder, decoder, vq = mlp(h * w, latent), mlp(latent, h * w), {}
    for i in range(groups):
        embed = torch.randn(1, n_embed, latent, generator=g)
        vq |= {f"layers.{i}._codebook.initted": torch.Tensor([True]),
               f"layers.{i}._codebook.cluster_size": torch.ones(1, n_embed),
               f"layers.{i}._codebook.embed_avg": embed.clone(), f"layers.{i}._codebook.embed": embed}
    optimizer = torch.optim.Adam([torch.nn.Parameter(v.clone()) for v in (*encoder.values(), *decoder.values())],
                                 lr=1e-3, weight_decay=1e-4)
    (directory / "checkpoints").mkdir(parents=True)
    torch.save({"encoder": encoder, "decoder": decoder, "optimizer": optimizer.state_dict(), "vq_embedding": vq},
               directory / "checkpoints" / "model.pt")
    (directory / "config.json").write_text(json.dumps({
        "input_dim_w": w, "input_dim_h": h, "n_latent_dims": latent, "vqvae_n_embed": n_embed, "vqvae_groups": groups,
        "eval": False, "device": "cuda", "load_dir": None, "encoder_loss_multiplier": 1.0, "act_scale": act_scale}))
    return encoder, decoder, [vq[f"layers.{i}._codebook.embed"][0] for i in range(groups)], act_scale


def _reference_mlp(state, x):
    x = torch.relu(x @ state["encoder.0.weight"].T + state["encoder.0.bias"])
    x = torch.relu(x @ state["encoder.2.weight"].T + state["encoder.2.bias"])
    return x @ state["fc.weight"].T + state["fc.bias"]


def test_a_vq_folder_written_by_vqbet_loads_and_codes_as_vqbet_computes(tmp_path):
    encoder, decoder, codebooks, act_scale = write_vqbet_folder(tmp_path / "vq")
    tokenizer = ActionTokenizer.from_pretrained(tmp_path / "vq")  # VQ-BeT's `initted` is (1,), the pip library's ()
    assert tokenizer.config.act_scale == act_scale and tokenizer.config.num_codebooks == 3
    chunks = torch.randn(64, 8, 7, generator=torch.Generator().manual_seed(1))
    residual, expected = _reference_mlp(encoder, chunks.reshape(64, 56) / act_scale), []
    for embed in codebooks:  # residual quantisation: nearest code (Euclidean), then subtract it
        code = torch.cdist(residual, embed).argmin(1)
        expected.append(code)
        residual = residual - embed[code]
    expected = torch.stack(expected, 1)
    assert torch.equal(tokenizer.encode(chunks), expected)
    decoded = _reference_mlp(decoder, sum(embed[expected[:, i]] for i, embed in enumerate(codebooks))) * act_scale
    torch.testing.assert_close(tokenizer.decode(expected), decoded.reshape(64, 8, 7), rtol=1e-5, atol=1e-5)


def test_tokenizer_training_uses_the_straight_through_gradient_by_default():
    assert ActionTokenizer().vq.layers[0].rotation_trick is False
    assert ActionTokenizer(ActionTokenizerConfig(rotation_trick=True)).vq.layers[0].rotation_trick is True


def test_a_chunks_decoding_does_not_depend_on_its_batch():
    torch.manual_seed(3)
    tokenizer = ActionTokenizer().eval()
    codes = torch.randint(0, tokenizer.config.codebook_size, (64, tokenizer.config.num_codebooks))
    batched = tokenizer.decode(codes)
    for i in (0, 17, 63):  # bit for bit: rollouts must not depend on which envs shared a query
        assert torch.equal(batched[i], tokenizer.decode(codes[i:i + 1])[0])
