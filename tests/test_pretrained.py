"""save_pretrained / from_pretrained for the policy, the action tokenizer and the world model; LoRA export."""

from __future__ import annotations

import json

import huggingface_hub
import pytest
import torch

from minivla_wmrl.policy.action_tokenizer import ActionTokenizer, ActionTokenizerConfig
from minivla_wmrl.policy.minivla import MiniVLA
from tests.tiny_policy import make_policy
from world_models.progress_model import ProgressModelConfig, ProgressWorldModel


def _models():
    torch.manual_seed(0)
    return {"policy": (MiniVLA, make_policy(seed=5)),
            "action_tokenizer": (ActionTokenizer, ActionTokenizer(ActionTokenizerConfig(codebook_size=16))),
            "world_model": (ProgressWorldModel, ProgressWorldModel(ProgressModelConfig(image_size=32, dim=32,
                                                                                      layers=1)))}


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    first, second = a.state_dict(), b.state_dict()
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("kind", ["policy", "action_tokenizer", "world_model"])
def test_each_kind_saves_and_loads_from_a_directory_and_from_a_hub_repo_id(kind, tmp_path, monkeypatch):
    cls, model = _models()[kind]
    model.save_pretrained(tmp_path / "saved")
    files = {p.name for p in (tmp_path / "saved").iterdir()}
    assert {"config.json", "model.safetensors", "README.md"} <= files
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind
    assert "library_name: minivla-wmrl" in (tmp_path / "saved" / "README.md").read_text()
    assert _same_weights(cls.from_pretrained(tmp_path / "saved"), model)
    assert _same_weights(cls.from_pretrained(str(tmp_path / "saved")), model)

    asked = {}

    def snapshot_download(repo_id, **options):  # the Hub is not reachable here: resolve the id to the saved copy
        asked.update(options, repo_id=repo_id)
        return str(tmp_path / "saved")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert _same_weights(cls.from_pretrained("someone/minivla-wmrl-test", revision="v1"), model)
    assert asked["repo_id"] == "someone/minivla-wmrl-test" and asked["revision"] == "v1"


def test_checkpoints_written_before_the_hub_contract_still_load(tmp_path):
    from minivla_wmrl.policy.storage import write_policy

    policy = make_policy(seed=6)
    (tmp_path / "old").mkdir()
    write_policy(policy, tmp_path / "old")  # the pre-mixin writer; our format has no README
    (tmp_path / "old" / "action_tokenizer" / "README.md").unlink()
    assert _same_weights(MiniVLA.from_pretrained(tmp_path / "old"), policy)


def test_a_missing_directory_or_a_bad_repo_id_is_named(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="policy checkpoint .*nowhere: no such directory"):
        MiniVLA.from_pretrained(tmp_path / "nowhere")

    def offline(repo_id, **options):
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(FileNotFoundError, match="world model someone/absent: no such local directory, and no Hub "
                                                "repo of that id could be downloaded .*Name or service not known"):
        ProgressWorldModel.from_pretrained("someone/absent")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="broken/config.json"):
        ActionTokenizer.from_pretrained(tmp_path / "broken")


def test_lora_adapters_export_alone_in_peft_format(tmp_path):
    from peft import PeftModel
    from transformers import Qwen2Config, Qwen2ForCausalLM

    policy = make_policy(seed=7)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        policy.save_adapter(tmp_path / "none")
    base_weights = {k: v.clone() for k, v in policy.llm.state_dict().items()}
    policy.add_lora(r=4, alpha=8)
    with torch.no_grad():
        for name, parameter in policy.llm.named_parameters():
            if "lora_B" in name:
                parameter.normal_()
    with pytest.raises(ValueError, match="name the one its adapters belong to"):
        policy.save_adapter(tmp_path / "adapter")  # built in code: its base is unknown
    policy.save_adapter(tmp_path / "adapter", base_model="runs/demo/sft/final")
    assert {p.name for p in (tmp_path / "adapter").iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["base_model_name_or_path"] == "runs/demo/sft/final"

    base = Qwen2ForCausalLM(Qwen2Config(**policy.config.llm))
    base.load_state_dict(base_weights)
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    ids = torch.arange(12)[None] % len(policy.tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, policy.llm.eval()(input_ids=ids).logits)


def test_model_cards_say_what_the_model_is_its_base_data_and_evaluation(tmp_path):
    policy = make_policy(seed=7)
    policy.save_pretrained(tmp_path / "sft")
    card = (tmp_path / "sft" / "README.md").read_text()
    assert "A MiniVLA policy (" in card and "Base**: none (trained from its config)" in card
    assert "statistics of" in card and "Evaluation**: none recorded" in card
    loaded = MiniVLA.from_pretrained(tmp_path / "sft")
    info = tmp_path / "eval_info.json"
    info.write_text(json.dumps({"overall": {"successes": 17, "trials": 30, "success_rate": 17 / 30},
                                "settings": {"suite": "libero_90"}}))
    loaded.save_pretrained(tmp_path / "grpo", model_card_kwargs={"evaluation": str(info)})
    card = (tmp_path / "grpo" / "README.md").read_text()
    assert f"Base**: {tmp_path / 'sft'}" in card and "17/30 = 56.7% success on libero_90" in card
    assert "MiniVLA.from_pretrained" in card
