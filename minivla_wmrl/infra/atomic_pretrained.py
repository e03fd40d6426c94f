"""The Hugging Face save/load contract (`world_models.pretrained`) with atomic writes, for the
policy and the action tokenizer: `save_pretrained` writes a temporary sibling and renames it into
place when complete, so an interrupted save never leaves a half-written checkpoint."""

from __future__ import annotations

from pathlib import Path

from minivla_wmrl.infra.outputs import replaced_directory
from world_models.pretrained import Pretrained


class AtomicPretrained(Pretrained):
    def save_pretrained(self, save_directory: str | Path, **options) -> str | None:
        if options.get("push_to_hub") and not options.get("repo_id"):
            options["repo_id"] = Path(save_directory).name  # the mixin's default, not the temporary's name
        with replaced_directory(Path(save_directory), "save_pretrained") as tmp:
            return super().save_pretrained(tmp, **options)
