"""`save_pretrained(dir)` / `from_pretrained(dir_or_repo_id)` for every model kind of the toolkit.

huggingface_hub's `ModelHubMixin` gives the Hugging Face contract (a model card, `push_to_hub`,
Hub download options); each class keeps its own directory format (safetensors weights + JSON
config), so checkpoints written before this mixin load unchanged. It lives in this package, the
one the others build on, because `world_models` must not import `minivla_wmrl`.
"""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
from huggingface_hub import ModelCard, ModelHubMixin


def is_hub_repo_id(name: str) -> bool:
    """`owner/name` that is not spelled as a local path (relative `./`, absolute, `~`)."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


def pretrained_directory(name_or_path: str | Path, kind: str, **hub_options) -> Path:
    """A local directory as it is; anything else is taken as a Hub repo id and downloaded (cached)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    name = str(name_or_path)
    if path.exists() or not is_hub_repo_id(name):
        raise FileNotFoundError(f"{kind} {name}: no such directory (nor a Hub repo id of the form owner/name)")
    try:  # looked up when called (not imported by name), so that tests can stand in for the Hub
        return Path(huggingface_hub.snapshot_download(repo_id=name, **hub_options))
    except Exception as error:  # offline, unknown repo, no access: one message naming what was asked for
        raise FileNotFoundError(f"{kind} {name}: no such local directory, and no Hub repo of that id could be "
                                f"downloaded ({type(error).__name__}: {error})") from None


MODEL_CARD = """---
{{ card_data }}
---

# {{ title }}

{{ what }}

- **Base**: {{ base }}
- **Training data**: {{ data }}
- **Evaluation**: {{ evaluation }}

Load it with `{{ loader }}.from_pretrained(directory_or_repo_id)` from the minivla-wmrl package
(safetensors weights and a JSON config).
"""


class Pretrained(ModelHubMixin, library_name="minivla-wmrl", tags=["robotics", "minivla-wmrl"],
                 model_card_template=MODEL_CARD):
    """Subclasses implement `_save_pretrained(directory)` (write their files into it) and the class
    method `load(directory, **options)`, which reads and checks their own config.json."""

    _pretrained_kind = "model"
    source: str | None = None  # the directory or Hub repo id it was loaded from (None: built in code)

    def card_facts(self) -> dict:
        """What the model card says (subclasses add their own): what it is, its base, data, evaluation."""
        return {"what": f"A minivla-wmrl {self._pretrained_kind}.",
                "base": self.source or "none (built from its config)", "data": "not recorded"}

    def generate_model_card(self, *args, evaluation: str | Path | None = None, **kwargs):
        """A card that says what the model is, its base, its training data and, when `save_pretrained(...,
        model_card_kwargs={"evaluation": "path/to/eval_info.json"})` names one, its evaluation."""
        facts = self.card_facts() | {"evaluation": "none recorded with this save"}
        if evaluation is not None:
            info = json.loads(Path(evaluation).read_text())
            overall = info["overall"]
            facts["evaluation"] = (f"{overall['successes']}/{overall['trials']} = {overall['success_rate']:.1%} "
                                   f"success on {info['settings']['suite']} ({evaluation})")
        cls = type(self)
        return ModelCard.from_template(card_data=self._hub_mixin_info.model_card_data,
                                       template_str=self._hub_mixin_info.model_card_template,
                                       title=f"{cls.__name__} ({self._pretrained_kind})",
                                       loader=f"{cls.__module__}.{cls.__name__}", **facts)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *, force_download: bool = False,
                        token: str | bool | None = None, cache_dir: str | Path | None = None,
                        local_files_only: bool = False, revision: str | None = None, **options):
        """A local directory, or a Hub repo id downloaded first; `options` go to `load` (e.g. device).
        The mixin's own config.json decoding is skipped: `load` reports a damaged file by name."""
        directory = pretrained_directory(pretrained_model_name_or_path, cls._pretrained_kind, revision=revision,
                                         cache_dir=cache_dir, force_download=force_download,
                                         local_files_only=local_files_only, token=token)
        model = cls.load(directory, **options)
        model.source = str(pretrained_model_name_or_path)
        return model
