"""`save_pretrained(dir)` / `from_pretrained(dir_or_repo_id)` for every model kind of the toolkit.

huggingface_hub's `ModelHubMixin` gives the Hugging Face contract (a model card, `push_to_hub`,
Hub download options); each class keeps its own directory format (safetensors weights + JSON
config), so checkpoints written before this mixin load unchanged. It lives in this package, the
one the others build on, because `world_models` must not import `minivla_wmrl`.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import ModelHubMixin


def pretrained_directory(name_or_path: str | Path, kind: str, **hub_options) -> Path:
    """A local directory as it is; anything else is taken as a Hub repo id and downloaded (cached)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    name = str(name_or_path)
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise FileNotFoundError(f"{kind} {name}: no such directory (nor a Hub repo id of the form owner/name)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=name, **hub_options))
    except Exception as error:  # offline, unknown repo, no access: one message naming what was asked for
        raise FileNotFoundError(f"{kind} {name}: no such local directory, and no Hub repo of that id could be "
                                f"downloaded ({type(error).__name__}: {error})") from None


MODEL_CARD = """---
{{ card_data }}
---

A minivla-wmrl checkpoint: safetensors weights and a JSON config. Load it
with `from_pretrained` of its class: `minivla_wmrl.policy.MiniVLA` (a policy),
`minivla_wmrl.action_tokenizer.ActionTokenizer` or `world_models.progress_model.ProgressWorldModel`.
"""


class Pretrained(ModelHubMixin, library_name="minivla-wmrl", tags=["robotics", "minivla-wmrl"],
                 model_card_template=MODEL_CARD):
    """Subclasses implement `_save_pretrained(directory)` (write their files into it) and the class
    method `load(directory, **options)`, which reads and checks their own config.json."""

    _pretrained_kind = "model"

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *, force_download: bool = False,
                        token: str | bool | None = None, cache_dir: str | Path | None = None,
                        local_files_only: bool = False, revision: str | None = None, **options):
        """A local directory, or a Hub repo id downloaded first; `options` go to `load` (e.g. device).
        The mixin's own config.json decoding is skipped: `load` reports a damaged file by name."""
        directory = pretrained_directory(pretrained_model_name_or_path, cls._pretrained_kind, revision=revision,
                                         cache_dir=cache_dir, force_download=force_download,
                                         local_files_only=local_files_only, token=token)
        return cls.load(directory, **options)
