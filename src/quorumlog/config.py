"""Configuration: TOML files plus environment overrides, typed and validated.

Every component declares its settings as a :class:`Config` subclass (a frozen
msgspec Struct): field names carry their unit (``segment_size_bytes``,
``election_timeout_ticks``) and each class checks combinations in
``validate()``. A TOML file is read with :mod:`tomllib`; then environment
variables override single fields::

    QUORUMLOG_WAL__SEGMENT_SIZE_BYTES=1048576   ->  [wal] segment_size_bytes

(prefix, then the section path and field joined by ``__``; values are parsed as
TOML scalars, so ``true``, ``12`` and ``"text"`` all work, and a bare word is
taken as a string). Unknown keys are errors, so a typo never silently falls
back to a default.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from quorumlog.errors import ConfigError

ENV_PREFIX = "QUORUMLOG_"

C = TypeVar("C", bound="Config")


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base class of configuration sections."""

    def validate(self) -> None:
        """Reject bad combinations; subclasses extend this. Raises ConfigError."""

    def replace(self: C, **changes: Any) -> C:
        new = msgspec.structs.replace(self, **changes)
        new.validate()
        return new


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)


def from_mapping(cls: type[C], data: Mapping[str, Any], *, where: str = "config") -> C:
    """Build and validate ``cls`` from a plain mapping (parsed TOML)."""
    try:
        cfg = msgspec.convert(dict(data), cls, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    try:
        cfg.validate()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.message}") from None
    return cfg


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def env_overrides(environ: Mapping[str, str], prefix: str = ENV_PREFIX) -> dict[str, Any]:
    """Turn ``PREFIX_SECTION__FIELD=value`` variables into a nested mapping."""
    tree: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(prefix) or "__" not in name[len(prefix):]:
            continue
        path = [part.lower() for part in name[len(prefix):].split("__")]
        if any(not part for part in path):
            raise ConfigError(f"environment variable {name}: empty path component")
        node = tree
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"environment variable {name}: {part} is not a section")
            node = child
        node[path[-1]] = _parse_env_value(raw)
    return tree


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``over`` into a copy of ``base``."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None


def load(
    cls: type[C],
    path: str | os.PathLike[str] | None = None,
    *,
    section: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> C:
    """Load ``cls`` from an optional TOML file (``[section]`` if given) and env.

    Environment overrides for a section use ``QUORUMLOG_<SECTION>__<FIELD>``; for
    a top-level config, ``QUORUMLOG_<FIELD>__...`` paths address nested tables.
    """
    data: dict[str, Any] = read_toml(path) if path is not None else {}
    env = env_overrides(os.environ if environ is None else environ)
    if section is not None:
        data = data.get(section, {})
        if not isinstance(data, dict):
            raise ConfigError(f"[{section}] must be a table")
        env = env.get(section, {})
    where = f"{path or 'defaults'}" + (f" [{section}]" if section else "")
    return from_mapping(cls, merge(data, env), where=where)
