"""Config dataclasses from dicts, YAML recipes and `key=value` overrides, with every error naming the key.

A field declares its range or choices in its type: `steps: Annotated[int, Range(1)]`,
`dtype: Literal["float32", "bfloat16"]`. `config_from_dict` enforces types, ranges and choices of
what it reads; `check_config` enforces ranges and choices of a built config (commands call it
before any work, so configs made in code are checked too).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml

from world_models.pretrained import is_hub_repo_id

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Range:
    """Inclusive bounds of a numeric setting (None: unbounded); `below` and `above` are exclusive."""

    low: float | None = None
    high: float | None = None
    below: float | None = None
    above: float | None = None

    def check(self, value, where: str) -> None:
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        wrong = ((self.low is not None and value < self.low) or (self.high is not None and value > self.high)
                 or (self.below is not None and value >= self.below)
                 or (self.above is not None and value <= self.above) or value != value)  # NaN fails too
        if wrong:
            raise ValueError(f"{where}: {value!r} is out of range; expected {self}")

    def __str__(self) -> str:
        bounds = ((">=", self.low), (">", self.above), ("<=", self.high), ("<", self.below))
        return " and ".join(f"{op} {bound:g}" for op, bound in bounds if bound is not None) or "any number"


@dataclasses.dataclass(frozen=True)
class InputPath:
    """An input path setting: a `dir` (or a Hub repo id `owner/name`), a `file`, or `either`; `names`
    are built-in values that are not paths (e.g. the tokenizer "tiny"). Checked by `check_input_paths`."""

    kind: typing.Literal["dir", "file", "either"]
    names: tuple[str, ...] = ()

    def check(self, value, where: str) -> None:
        for item in [value] if isinstance(value, str) else list(value or []):
            if not item or item in self.names:
                continue
            path = Path(item).expanduser()
            hub_id = is_hub_repo_id(item)
            if self.kind == "file" and path.is_dir():
                raise IsADirectoryError(f"{where}: {item} is a directory; expected a file")
            if self.kind == "dir" and path.exists() and not path.is_dir():
                raise NotADirectoryError(f"{where}: {item} is a file; expected a directory")
            if not path.exists() and not (self.kind == "dir" and hub_id):
                expected = {"file": "a file", "dir": "a directory (or a Hub repo id owner/name)",
                            "either": "a file or a directory"}[self.kind]
                raise FileNotFoundError(f"{where}: {item} does not exist; expected {expected}")


@dataclasses.dataclass(frozen=True)
class Mark:
    """What a setting is, declared beside it (`Annotated[int, Range(1), RESUMABLE]`), so lists of
    settings with a role are derived from the declarations (`marked_keys`), not kept by hand."""

    name: str


RESUMABLE = Mark("resumable")  # a resumed run may change it: how long it runs, how often it saves or checks
RUNTIME = Mark("runtime")  # where and how the work runs, never what it computes: resumable, and ablation
# cells may differ in it


def marked_keys(cls: type, mark: Mark, prefix: str = "") -> tuple[str, ...]:
    """The dotted keys of `cls`'s settings (nested dataclasses included) that carry `mark`; RUNTIME
    settings count as RESUMABLE too."""
    marks = {mark, RUNTIME} if mark == RESUMABLE else {mark}
    keys = []
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        extras = typing.get_args(hint)[1:] if typing.get_origin(hint) is typing.Annotated else ()
        base = _constraints(hint)[0]
        if dataclasses.is_dataclass(base):
            keys += marked_keys(base, mark, f"{prefix}{name}.")
        elif marks & {e for e in extras if isinstance(e, Mark)}:
            keys.append(f"{prefix}{name}")
    return tuple(keys)


Seed = Annotated[int, Range(0, below=2**32)]  # every seed reaches numpy, whose seeds are 0 <= seed < 2**32


def _constraints(hint) -> tuple[Any, list]:
    """(the type, its Range annotations) of a possibly Annotated hint."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *extras = typing.get_args(hint)
        return base, [e for e in extras if isinstance(e, Range)]
    return hint, []


def check_config(config, where: str = "config") -> None:
    """Raise naming the first field of `config` (nested dataclasses included) outside its declared
    range or choices."""
    hints = typing.get_type_hints(type(config), include_extras=True)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        hint, ranges = _constraints(hints[f.name])
        if dataclasses.is_dataclass(value):
            check_config(value, f"{where}.{f.name}")
            continue
        for r in ranges:
            r.check(value, f"{where}.{f.name}")
        _check_choice(value, hint, f"{where}.{f.name}")


def check_input_paths(config, where: str = "config", skip: frozenset[str] = frozenset(), _key: str = "") -> None:
    """Raise naming the first input path setting of `config` (nested dataclasses included) that is
    missing or of the wrong kind. Commands call it before any work; `skip`: dotted keys not to check
    (a pipeline's connections between stages, whose outputs do not exist yet)."""
    hints = typing.get_type_hints(type(config), include_extras=True)
    for f in dataclasses.fields(config):
        value, hint, key = getattr(config, f.name), hints[f.name], f"{_key}{f.name}"
        if key in skip:
            continue
        if dataclasses.is_dataclass(value):
            check_input_paths(value, f"{where}.{f.name}", skip, f"{key}.")
        elif typing.get_origin(hint) is typing.Annotated:
            for extra in typing.get_args(hint)[1:]:
                if isinstance(extra, InputPath):
                    extra.check(value, f"{where}.{f.name}")


def _check_choice(value, hint, where: str) -> None:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = list(typing.get_args(hint)) if union else [hint]
    literals = [o for o in options if typing.get_origin(o) is typing.Literal]
    if (literals and not any(value in typing.get_args(o) for o in literals)
            and not (value is None and type(None) in options)):
        choices = [c for o in literals for c in typing.get_args(o)]
        raise ValueError(f"{where}: {value!r} is not one of {choices}")


def config_from_dict(cls: type[T], data: dict, where: str) -> T:
    """Build `cls` (nested dataclasses included) from a dict; unknown keys and wrong types are errors."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls, include_extras=True)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; expected a subset of {sorted(known)}")
    values = {}
    for name, value in data.items():
        hint, ranges = _constraints(hints[name])
        if dataclasses.is_dataclass(hint):
            values[name] = config_from_dict(hint, value, f"{where}.{name}")
        else:
            values[name] = _check_type(value, hint, f"{where}.{name}")  # Literal choices included
            for r in ranges:
                r.check(values[name], f"{where}.{name}")
    return cls(**values)


def _check_type(value: Any, hint: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(hint):  # e.g. the items of a list[Arm]
        return config_from_dict(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return _check_type(value, option, where)
            except ValueError:
                continue
        raise ValueError(f"{where}: {value!r} is not a {hint}")
    if hint is type(None):
        if value is None:
            return None
        raise ValueError(f"{where}: expected null, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        return [_check_type(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):  # YAML 1.1 reads "3e-3" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{where}: expected float, got {value!r}") from None
    if hint in (int, float, str, bool):
        if isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
            return value
        raise ValueError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def command_line_parser(cls: type, prog: str, description: str):
    """An argparse parser whose flags are the fields of the config dataclass `cls`: `--first-trial`
    for `first_trial`, the type, choices and default from the declaration, the help from the
    field's `metadata["help"]`; fields without a default are required, `metadata["cli"] = False`
    keeps a field off the command line, `metadata["positional"]` makes a list field the command's
    positional arguments. `config_from_dict(cls, vars(parsed), ...)` then checks
    ranges as for a recipe. argparse does the parsing; this only reads the declaration."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        hint, ranges = _constraints(hints[f.name])
        options = [o for o in typing.get_args(hint) if o is not type(None)] if typing.get_origin(hint) in (
            typing.Union, types.UnionType) else [hint]
        kind = options[0]
        kwargs: dict[str, Any] = {"help": " ".join(filter(None, [f.metadata.get("help"), *(
            f"({r})" for r in ranges)])) or None}
        if typing.get_origin(kind) is typing.Literal:
            kwargs.update(choices=list(typing.get_args(kind)), type=type(typing.get_args(kind)[0]))
        elif typing.get_origin(kind) is list:
            kwargs.update(nargs="*", type=typing.get_args(kind)[0])
        elif kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default"] = f.default_factory()
        else:
            kwargs["required"] = True
        if f.metadata.get("positional"):
            parser.add_argument(f.name, nargs="+", type=kwargs["type"], help=kwargs["help"])
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, **kwargs)
    return parser


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `section.key=value` strings to a nested dict. Values are parsed as YAML (numbers,
    booleans, lists), except that `#` never starts a comment: `out=runs/exp #2` is the string
    `runs/exp #2` (YAML would silently drop ` #2`)."""
    for override in overrides:
        if "=" not in override:
            raise ValueError(f"override {override!r} is not key=value")
        key, raw = override.split("=", 1)
        node, parts = data, key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {key}: {part} is not a section")
        node[parts[-1]] = _override_value(raw)
    return data


def _override_value(raw: str):
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise ValueError(f"override value {raw!r} is not valid YAML: {error}") from None
    if "#" in raw and (not isinstance(value, str) or value != raw.strip()):
        if raw.strip()[:1] in ("'", '"'):
            return value  # quoted on purpose
        return raw  # YAML read part of it as a comment: keep every character the user typed
    return value


def load_recipe(cls: type[T], path: Path, overrides: list[str] = ()) -> T:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"recipe {path} is not valid YAML: {error}") from None
    return config_from_dict(cls, apply_overrides(data, list(overrides)), str(path))
