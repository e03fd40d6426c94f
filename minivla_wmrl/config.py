"""Building config dataclasses from dicts (JSON files, recipes) with unknown keys named."""

from __future__ import annotations

from dataclasses import fields
from typing import TypeVar

T = TypeVar("T")


def config_from_dict(cls: type[T], data: dict, where: str) -> T:
    """`cls(**data)`, but an unknown key is an error naming `where`, the key and the known keys."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; expected a subset of {sorted(known)}")
    return cls(**data)
