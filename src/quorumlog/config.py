"""Configuration: TOML files plus environment overrides, typed and validated.

Every component declares its settings as a :class:`Config` subclass (a frozen
msgspec Struct): field names carry their unit (``segment_size_bytes``,
``election_timeout_ticks``) and each class checks combinations in
``validate()``. A TOML file is read with :mod:`tomllib`; then environment
variables override single fields::

    QUORUMLOG_TABLE__WAL_SEGMENT_SIZE_BYTES=1048576   ->  [table] wal_segment_size_bytes

(prefix, then the section path and field joined by ``__``; values are parsed as
TOML scalars, so ``true``, ``12`` and ``"text"`` all work, and a bare word is
taken as a string). Unknown keys are errors, so a typo never silently falls
back to a default: in the file and in the environment. An error caused by an
environment value names the variable and its value. A ``QUORUMLOG_`` variable
with one underscore where two belong (``QUORUMLOG_NODE_ID``) is rejected with
the name it probably meant (``QUORUMLOG_NODE__ID``), as is an override of a
section the config does not have; the variables quorumlog reads directly
(``DIRECT_ENV_VARIABLES``) are not overrides and are left alone.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from quorumlog.errors import ConfigError

ENV_PREFIX = "QUORUMLOG_"
# Variables read directly with os.environ (or a CLI envvar), not config
# overrides: never rejected as unknown. Add a name here when code reads one.
DIRECT_ENV_VARIABLES = frozenset({
    "QUORUMLOG_CLUSTER_DIR",      # node._cluster: the local cluster directory
    "QUORUMLOG_MEMBERS",          # cli --members/--meta: meta addresses
    "QUORUMLOG_SECURITY_FILE",    # cli --security
    "QUORUMLOG_LEDGER_PASSWORD",  # cli ledger --password
    "QUORUMLOG_LOG_LEVEL",        # spark workers' log level
    "QUORUMLOG_SPARK",            # scripts/setup.sh: install the spark extra
    "QUORUMLOG_SIM_OFFSET",       # tests/ledger: the far-offset simulator seeds
    "QUORUMLOG_REWRITE_GOLDEN",   # tests/raft: rewrite golden transcripts
    "QUORUMLOG_MODEL_EXAMPLES",   # tests/table: examples of the store's model check
    "QUORUMLOG_DEMO_SKIP_BENCH",  # scripts/demo.sh
})
_MSGSPEC_PATH = re.compile(r"at `\$((?:\.[A-Za-z0-9_]+|\[\d+\])*)`")
_UNKNOWN_FIELD = re.compile(r"unknown field `([^`]+)`")

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
        path = _env_path(name, prefix)
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


def _env_path(name: str, prefix: str) -> list[str]:
    return [part.lower() for part in name[len(prefix):].split("__")]


def _leaf_paths(cls: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every field path of a config class, nested sections walked (``("node", "id")``)."""
    info = msgspec.inspect.type_info(cls) if isinstance(cls, type) else cls
    if isinstance(info, msgspec.inspect.UnionType):
        for member in info.types:
            if isinstance(member, msgspec.inspect.StructType):
                yield from _leaf_paths(member, path)
        return
    if not isinstance(info, msgspec.inspect.StructType):
        yield path
        return
    for field in info.fields:
        inner = field.type
        nested = isinstance(inner, msgspec.inspect.StructType) or (
            isinstance(inner, msgspec.inspect.UnionType)
            and any(isinstance(t, msgspec.inspect.StructType) for t in inner.types))
        if nested:
            yield from _leaf_paths(inner, (*path, field.name))
        else:
            yield (*path, field.name)


def _suggest(cls: type[Config], section: str | None, rest: str, prefix: str) -> str:
    """The override name a one-underscore variable probably meant."""
    for leaf in _leaf_paths(cls):
        full = (section, *leaf) if section is not None else leaf
        if "_".join(full) == rest.lower():
            return f"; did you mean {prefix}{'__'.join(full).upper()}?"
    head, sep, tail = rest.partition("_")
    return f"; did you mean {prefix}{head}__{tail}?" if sep and tail else ""


def check_env_names(cls: type[Config], section: str | None, environ: Mapping[str, str],
                    prefix: str = ENV_PREFIX) -> None:
    """Reject ``PREFIX`` variables that look like overrides but override nothing.

    One underscore where two belong (``QUORUMLOG_NODE_ID``), unless quorumlog
    reads the name directly (``DIRECT_ENV_VARIABLES``); for a whole-file config
    (no ``section``), an override of a section ``cls`` does not have.
    """
    sections = {leaf[0] for leaf in _leaf_paths(cls)}
    for name in sorted(environ):
        if not name.startswith(prefix) or name in DIRECT_ENV_VARIABLES:
            continue
        rest = name[len(prefix):]
        if "__" not in rest:
            raise ConfigError(
                f"environment variable {name}={environ[name]!r} is not a quorumlog setting: "
                f"overrides are {prefix}<SECTION>__<FIELD>, with two underscores"
                + _suggest(cls, section, rest, prefix))
        head = _env_path(name, prefix)[0]
        if section is None and head not in sections:
            raise ConfigError(
                f"environment variable {name}={environ[name]!r} overrides [{head}], which is "
                f"not a section of this config; sections: {', '.join(sorted(sections))}")


def _blame_env(message: str, origins: Mapping[tuple[str, ...], str]) -> list[str]:
    """The environment variables a msgspec validation error points at."""
    found = _MSGSPEC_PATH.search(message)
    if found is None:
        return []
    path = tuple(p for p in re.split(r"[.\[]", found.group(1)) if p and not p.endswith("]"))
    unknown = _UNKNOWN_FIELD.search(message)
    if unknown is not None:
        path = (*path, unknown.group(1))
    return [var for where, var in origins.items()
            if where[:len(path)] == path or path[:len(where)] == where]


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
    environ = os.environ if environ is None else environ
    check_env_names(cls, section, environ)
    env = env_overrides(environ)
    if section is not None:
        data = data.get(section, {})
        if not isinstance(data, dict):
            raise ConfigError(f"[{section}] must be a table")
        env = env.get(section, {})
    origins = _env_origins(environ, section)
    where = f"{path or 'defaults'}" + (f" [{section}]" if section else "")
    try:
        return from_mapping(cls, merge(data, env), where=where)
    except ConfigError as exc:
        if not origins:
            raise
        blamed = (_blame_env(exc.message, origins)
                  or _blame_by_removal(cls, data, env, origins, where))
        reason = exc.message.removeprefix(where + ": ")
        if blamed:
            raise ConfigError(f"environment variable {_show(blamed, environ)}: {reason}") from None
        raise ConfigError(f"{where} with the environment overrides "
                          f"{_show(list(origins.values()), environ)}: {reason}") from None


def _blame_by_removal(cls: type[C], data: dict[str, Any], env: dict[str, Any],
                      origins: Mapping[tuple[str, ...], str], where: str) -> list[str]:
    """The override whose removal makes a config that ``validate()`` rejected valid."""
    for override, name in origins.items():
        try:
            from_mapping(cls, merge(data, _without(env, override)), where=where)
        except ConfigError:
            continue
        return [name]
    return []


def _without(tree: Mapping[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    out = dict(tree)
    if len(path) == 1:
        out.pop(path[0], None)
    elif isinstance(out.get(path[0]), Mapping):
        out[path[0]] = _without(out[path[0]], path[1:])
    return out


def _env_origins(environ: Mapping[str, str], section: str | None,
                 prefix: str = ENV_PREFIX) -> dict[tuple[str, ...], str]:
    """Override path (relative to ``section``) -> the variable that set it."""
    out: dict[tuple[str, ...], str] = {}
    for name in environ:
        if not name.startswith(prefix) or "__" not in name[len(prefix):]:
            continue
        path = tuple(_env_path(name, prefix))
        if section is None:
            out[path] = name
        elif path[0] == section:
            out[path[1:]] = name
    return out


def _show(names: list[str], environ: Mapping[str, str]) -> str:
    return ", ".join(f"{name}={environ[name]!r}" for name in sorted(names))
