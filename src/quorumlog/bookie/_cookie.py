"""A bookie's identity stored with its data (BookKeeper's *cookie*).

Why: a bookie whose disk was wiped and that comes back under its old id would
answer "no such entry" for entries it acknowledged before. Ledger recovery
counts such answers towards the end of a ledger, so a recoverable loss would
become a silent truncation (BookKeeper issue #2908, BP-44). The cookie lets a
bookie notice that its directories are not the ones it wrote, and refuse to
start as its old self.

A cookie names one *instance* of a bookie: a random instance id, the bookie
id, the directories and when it was made. It is written

- into every data directory of the bookie (``COOKIE`` in the journal
  directory, the ledger directory and the index directory), each copy also
  naming the directory's role, and
- into meta, at ``/bookies/cookies/<bookie id>`` (a persistent key, claimed
  with compare-and-swap so that two processes cannot both become the bookie).

On every start the bookie reads the copies and meta's cookie and decides
(``decide``, a pure function):

- ``NEW``: every directory is blank and meta has no cookie: a new instance is
  stamped (directories first, then the claim in meta; a crash in between
  leaves blank directories and no claim, which is ``NEW`` again);
- ``ADOPT``: the directories hold data but no cookie exists anywhere: data
  written before cookies existed; stamped like ``NEW``, with a warning;
- ``KEEP``: every directory holds the cookie meta holds: start;
- anything else refuses with :class:`InvalidCookieError`, saying what
  happened and what to do: a directory without its cookie (wiped), all of
  them blank while meta knows the bookie (disks lost), a cookie of another
  bookie or of another directory role (swapped), copies of different
  instances, or copies that differ from meta (an old copy of the disks).

Without meta (tests and tools) only the copies are compared with each other:
the bookie id is its address, which changes with every port-0 start.

``quorumlog bookie format`` is the operator's way back: it wipes the
directories and deletes the cookie in meta, so the next start is ``NEW``.
"""

from __future__ import annotations

import asyncio
import enum
import os
import shutil
import uuid
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec
from crc32c import crc32c

from quorumlog.bookie._bookie_config import BookieConfig
from quorumlog.bookie._entrylog import fsync_directory
from quorumlog.bookie._limbo import LimboRecord, limbo_key
from quorumlog.bookie._storage import INDEX_DIRECTORY
from quorumlog.bookie._storage_errors import InvalidCookieError
from quorumlog.clock import SYSTEM_CLOCK, Clock
from quorumlog.errors import (
    InvariantViolation,
    QuorumlogError,
    StorageError,
    UsageError,
    invariant,
)
from quorumlog.log import get_logger
from quorumlog.meta import (
    BlockingMetaClient,
    Compare,
    CompareOp,
    CompareTarget,
    DeleteOp,
    MetaClient,
    PutOp,
)
from quorumlog.proto import (
    BOOKIE_COOKIE_PREFIX,
    BOOKIE_REGISTRY_PREFIX,
    LEDGER_ID_COUNTER,
)

_log = get_logger(__name__)

COOKIE_FILE = "COOKIE"
COOKIE_TEMP_FILE = "COOKIE.new"  # written, fsynced, then renamed to COOKIE
COOKIE_FORMAT_VERSION = 1
# A cookie is a few hundred bytes; a larger file is not one of ours.
COOKIE_FILE_MAX_BYTES = 64 * 1024
# Entries a fresh file system has in its root (a new disk mounted as the
# directory): they do not make a directory hold data.
FILESYSTEM_ENTRIES = frozenset({"lost+found"})


class DirectoryRole(enum.StrEnum):
    JOURNAL = "journal"
    LEDGER = "ledger"
    INDEX = "index"


class Verdict(enum.Enum):
    NEW = "new"  # blank directories, no cookie in meta: stamp a new instance
    ADOPT = "adopt"  # data from before cookies, no cookie anywhere: stamp one
    KEEP = "keep"  # the directories and meta agree: start as this instance


class Cookie(msgspec.Struct, frozen=True, kw_only=True):
    """One instance of a bookie (the same in every directory and in meta)."""

    bookie_id: str
    instance_id: str  # a random UUID, new for every stamped instance
    journal_dir: str  # absolute paths when stamped (informational: data may move)
    ledger_dir: str
    created_at_ms: int  # wall clock, Unix epoch
    version: int = COOKIE_FORMAT_VERSION

    def describe(self) -> str:
        created = datetime.fromtimestamp(self.created_at_ms / 1000, UTC)
        return f"instance {self.instance_id} (created {created:%Y-%m-%d %H:%M:%S} UTC)"

    def encode(self) -> bytes:
        """The value kept in meta: sealed JSON (readable with ``quorumlog meta get``)."""
        return _seal(msgspec.json.encode(self))

    @classmethod
    def decode(cls, data: bytes, *, source: str) -> Cookie:
        body = _unseal(data, source)
        try:
            return msgspec.json.decode(body, type=cls)
        except msgspec.DecodeError as exc:
            raise _damaged(source, str(exc)) from None


class DirectoryCookie(msgspec.Struct, frozen=True, kw_only=True):
    """The copy in one directory: the cookie and the role it was written for."""

    role: DirectoryRole
    cookie: Cookie


class _Sealed(msgspec.Struct, frozen=True, kw_only=True):
    body: msgspec.Raw
    crc32c: int


def _seal(body: bytes) -> bytes:
    return msgspec.json.encode(_Sealed(body=msgspec.Raw(body), crc32c=crc32c(body))) + b"\n"


def _unseal(data: bytes, source: str) -> bytes:
    try:
        sealed = msgspec.json.decode(data, type=_Sealed)
    except msgspec.DecodeError as exc:
        raise _damaged(source, str(exc)) from None
    body = bytes(sealed.body)
    if crc32c(body) != sealed.crc32c:
        raise _damaged(source, "its CRC32C does not match")
    return body


def _damaged(source: str, reason: str) -> InvalidCookieError:
    return InvalidCookieError(
        f"the bookie cookie in {source} is damaged ({reason}); the bookie cannot tell "
        "whether its directories are its own, so it refuses to start. Check the disk; "
        "if the bookie's data cannot be trusted, re-add it as a new instance with "
        "`quorumlog bookie format --force <bookie id> --config <its node config>`")


def cookie_key(bookie_id: str) -> str:
    """The meta key of a bookie's cookie (persistent, not bound to a session)."""
    return f"{BOOKIE_COOKIE_PREFIX}{bookie_id}"


def new_cookie(bookie_id: str, config: BookieConfig, *, clock: Clock = SYSTEM_CLOCK) -> Cookie:
    return Cookie(bookie_id=bookie_id, instance_id=str(uuid.uuid4()),
                  journal_dir=str(Path(config.journal_dir).resolve()),
                  ledger_dir=str(Path(config.ledger_dir).resolve()),
                  created_at_ms=clock.wall_ms())


def identity_directories(config: BookieConfig) -> tuple[tuple[DirectoryRole, Path], ...]:
    """Every directory that holds a copy of the cookie."""
    ledger_dir = Path(config.ledger_dir)
    return ((DirectoryRole.JOURNAL, Path(config.journal_dir)),
            (DirectoryRole.LEDGER, ledger_dir),
            (DirectoryRole.INDEX, ledger_dir / INDEX_DIRECTORY))


# ---------------------------------------------------------------------- directories


@dataclass(frozen=True, slots=True)
class DirectoryState:
    """What one directory holds: its cookie copy (or None) and whether it has data."""

    role: DirectoryRole
    path: Path
    copy: DirectoryCookie | None
    blank: bool  # nothing but cookie files (or it does not exist)

    def where(self) -> str:
        return f"{self.role} directory {self.path}"


def read_directory(role: DirectoryRole, path: Path) -> DirectoryState:
    """The cookie copy and blankness of one directory (blocking: a worker thread)."""
    try:
        return _read_directory(role, path)
    except OSError as exc:
        raise StorageError(f"cannot read the bookie's {role} directory {path}: {exc}; "
                           "check the path, the mount and the permissions") from None


def _read_directory(role: DirectoryRole, path: Path) -> DirectoryState:
    try:
        names = set(os.listdir(path))
    except FileNotFoundError:
        return DirectoryState(role, path, None, blank=True)
    ignored = {COOKIE_FILE, COOKIE_TEMP_FILE, *FILESYSTEM_ENTRIES}
    if role is DirectoryRole.LEDGER:
        ignored.add(INDEX_DIRECTORY)  # the index directory is checked on its own
    copy = None
    if COOKIE_FILE in names:
        file = path / COOKIE_FILE
        with open(file, "rb") as f:
            data = f.read(COOKIE_FILE_MAX_BYTES + 1)
        if len(data) > COOKIE_FILE_MAX_BYTES:
            raise _damaged(str(file), f"larger than {COOKIE_FILE_MAX_BYTES} bytes")
        body = _unseal(data, str(file))
        try:
            copy = msgspec.json.decode(body, type=DirectoryCookie)
        except msgspec.DecodeError as exc:
            raise _damaged(str(file), str(exc)) from None
    return DirectoryState(role, path, copy, blank=not (names - ignored))


def read_directories(config: BookieConfig) -> list[DirectoryState]:
    return [read_directory(role, path) for role, path in identity_directories(config)]


def stamp_directories(config: BookieConfig, cookie: Cookie) -> None:
    """Write the cookie into every directory (temp file, fsync, rename, fsync)."""
    for role, path in identity_directories(config):
        data = _seal(msgspec.json.encode(DirectoryCookie(role=role, cookie=cookie)))
        try:
            _make_directory(path)
            temp = path / COOKIE_TEMP_FILE
            with open(temp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            temp.replace(path / COOKIE_FILE)
            fsync_directory(path)
        except OSError as exc:
            raise StorageError(f"cannot write the bookie's cookie into its {role} directory "
                               f"{path}: {exc}; check the path, the mount and the "
                               "permissions") from None


def _make_directory(path: Path) -> None:
    """mkdir -p, making each new directory's entry durable in its parent."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        fsync_directory(directory.parent)


def wipe_directories(config: BookieConfig) -> list[Path]:
    """Remove everything in the journal and ledger directories (kept themselves:
    they may be mount points); return the paths removed. Blocking."""
    removed: list[Path] = []
    for path in (Path(config.journal_dir), Path(config.ledger_dir)):
        try:
            removed.extend(_wipe(path))
        except OSError as exc:
            raise StorageError(f"cannot wipe {path}: {exc}; nothing was deleted in meta; "
                               "fix the cause and run format again") from None
    return removed


def _wipe(path: Path) -> list[Path]:
    if not path.is_dir():
        return []
    removed = []
    for child in sorted(path.iterdir()):
        if child.name in FILESYSTEM_ENTRIES:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
        removed.append(child)
    fsync_directory(path)
    return removed


# ---------------------------------------------------------------------- the decision


def _format_advice(bookie_id: str) -> str:
    return (
        f"re-add this bookie as a new instance: stop it, run `quorumlog bookie format "
        f"--force {bookie_id} --config <its node config>` (it wipes the bookie's journal and "
        "ledger directories and deletes its cookie in meta) and start it again; it comes up "
        "empty with a new instance id, and ledgers that had copies on it stay "
        "under-replicated until they are re-replicated")


def _restore_or_format(bookie_id: str) -> str:
    return ("If the original data still exists, put it back at the configured paths and "
            f"start again. Otherwise {_format_advice(bookie_id)}")


_NO_SUCH_ENTRY = (
    "Serving as its old self would answer \"no such entry\" for entries it acknowledged, "
    "which ledger recovery could take as the end of a ledger and truncate it")


def _refuse(bookie_id: str, happened: str, advice: str) -> InvalidCookieError:
    return InvalidCookieError(f"bookie {bookie_id} refuses to start: {happened}. {advice}.")


def decide(
    bookie_id: str,
    directories: Sequence[DirectoryState],
    meta_cookie: Cookie | None,
    *,
    with_meta: bool,
) -> tuple[Verdict, Cookie | None]:
    """Start as which instance, or refuse (see the module docstring).

    Returns ``(KEEP, cookie)``, ``(NEW, None)`` or ``(ADOPT, None)``; raises
    :class:`InvalidCookieError`. Pure: every input is passed in.
    """
    invariant(with_meta or meta_cookie is None, "a meta cookie without meta")
    stamped = [d for d in directories if d.copy is not None]
    for state in stamped:
        _check_copy(bookie_id, state, with_meta=with_meta)
    if all(d.blank for d in directories) and meta_cookie is None:
        return Verdict.NEW, None  # (copies left by a stamp that never got its claim)
    instances = {d.copy.cookie.instance_id for d in stamped if d.copy is not None}
    if len(instances) > 1:
        listed = "; ".join(f"{d.where()}: {_copy_of(d).cookie.describe()}" for d in stamped)
        raise _refuse(bookie_id, f"its directories hold cookies of different instances "
                      f"({listed}): a directory was restored from an older copy or comes "
                      "from another installation", _restore_or_format(bookie_id))
    if not stamped:
        if meta_cookie is None:
            return Verdict.ADOPT, None
        raise _refuse(bookie_id, _unstamped(directories, meta_cookie),
                      f"{_NO_SUCH_ENTRY}. {_restore_or_format(bookie_id)}")
    cookie = _copy_of(stamped[0]).cookie
    missing = [d for d in directories if d.copy is None]
    if missing:
        raise _refuse(bookie_id, _partial(missing, stamped, cookie, meta_cookie),
                      f"{_NO_SUCH_ENTRY}. {_restore_or_format(bookie_id)}")
    if not with_meta:
        return Verdict.KEEP, cookie
    if meta_cookie is None:
        raise _refuse(
            bookie_id, f"its directories hold the data of {cookie.describe()}, but meta has "
            f"no cookie for {bookie_id}: the cookie was deleted (`quorumlog bookie format`) "
            "without wiping these directories, or meta was reset",
            f"To start it as a new instance, wipe them: `quorumlog bookie format --force "
            f"{bookie_id} --config <its node config>`")
    if meta_cookie.instance_id != cookie.instance_id:
        raise _refuse(
            bookie_id, f"its directories hold {cookie.describe()}, but meta records "
            f"{meta_cookie.describe()} for {bookie_id}: the directories are an old copy of "
            f"this bookie's disks (it was formatted and re-added since), or another process "
            f"started as {bookie_id} with other directories",
            f"Make sure no other bookie runs as {bookie_id}. {_restore_or_format(bookie_id)}")
    return Verdict.KEEP, cookie


def _copy_of(state: DirectoryState) -> DirectoryCookie:
    if state.copy is None:
        raise InvariantViolation(f"invariant violated: {state.where()} has no cookie")
    return state.copy


def _check_copy(bookie_id: str, state: DirectoryState, *, with_meta: bool) -> None:
    """A copy must be this bookie's (with meta) and written for this directory."""
    copy = _copy_of(state)
    if with_meta and copy.cookie.bookie_id != bookie_id:
        raise _refuse(
            bookie_id, f"its {state.where()} holds the cookie of bookie "
            f"{copy.cookie.bookie_id} ({copy.cookie.describe()}), not of {bookie_id}: the "
            "directories of two bookies were swapped, or its config's journal_dir / "
            "ledger_dir point at another bookie's directories",
            "Give each bookie its own directories again (config paths or mounts). If this "
            f"bookie's own data is lost, {_format_advice(bookie_id)}")
    if copy.role != state.role:
        raise _refuse(
            bookie_id, f"its {state.where()} holds the cookie written for its {copy.role} "
            "directory: journal_dir and ledger_dir are swapped (in its config or in the "
            "mounts)", "Swap them back")


def _unstamped(directories: Sequence[DirectoryState], meta_cookie: Cookie) -> str:
    paths = ", ".join(str(d.path) for d in directories)
    if all(d.blank for d in directories):
        return (f"all its directories are empty ({paths}), but meta records "
                f"{meta_cookie.describe()} of this bookie: its disks were wiped or replaced, "
                "so every entry it acknowledged is gone from it")
    return (f"its directories ({paths}) hold data but no cookie, while meta records "
            f"{meta_cookie.describe()} of this bookie: they are not the directories it "
            "wrote (another installation's, or a copy made before its cookie existed)")


def _partial(missing: Sequence[DirectoryState], stamped: Sequence[DirectoryState],
             cookie: Cookie, meta_cookie: Cookie | None) -> str:
    gone = " and ".join(f"{d.where()} ({'empty' if d.blank else 'files but no cookie'})"
                        for d in missing)
    kept = " and ".join(d.where() for d in stamped)
    known = ", as meta does" if (
        meta_cookie is not None and meta_cookie.instance_id == cookie.instance_id) else ""
    return (f"its {gone} {'have' if len(missing) > 1 else 'has'} no cookie while its {kept} "
            f"{'hold' if len(stamped) > 1 else 'holds'} {cookie.describe()}{known}: "
            f"{'these directories were' if len(missing) > 1 else 'the directory was'} wiped "
            "or replaced, so entries this bookie acknowledged may be gone")


# ---------------------------------------------------------------------- start-up


async def establish_identity(
    config: BookieConfig,
    bookie_id: str,
    meta: MetaClient | None,
    executor: Executor,
) -> Cookie:
    """Check (and on a first start create) the bookie's identity; its cookie.

    Reads the directory copies on ``executor``, the meta cookie through
    ``meta`` (None: no meta), decides, and for NEW/ADOPT stamps the
    directories and then claims the meta key with compare-and-swap.
    """
    loop = asyncio.get_running_loop()
    directories = await loop.run_in_executor(executor, read_directories, config)
    meta_cookie, version = None, 0
    if meta is not None:
        kv = await meta.get(cookie_key(bookie_id))
        if kv is not None:
            meta_cookie = Cookie.decode(kv.value, source=f"meta key {kv.key}")
            version = kv.version
    verdict, cookie = decide(bookie_id, directories, meta_cookie, with_meta=meta is not None)
    if verdict is Verdict.KEEP:
        if cookie is None:
            raise InvariantViolation("invariant violated: KEEP without a cookie")
        _warn_if_moved(config, cookie)
        return cookie
    invariant(version == 0, f"{verdict} with a cookie in meta")
    cookie = new_cookie(bookie_id, config)
    await loop.run_in_executor(executor, stamp_directories, config, cookie)
    if meta is not None and not await meta.cas(cookie_key(bookie_id), 0, cookie.encode()):
        raise _refuse(bookie_id, f"another process claimed the identity of {bookie_id} in "
                      "meta while this one was starting", "Make sure only one bookie runs "
                      f"as {bookie_id}; then start this one again")
    if verdict is Verdict.ADOPT:
        _log.warning("bookie_cookie_adopted", bookie=bookie_id, instance=cookie.instance_id,
                     reason="the directories hold data written before bookies had cookies")
    else:
        _log.info("bookie_cookie_created", bookie=bookie_id, instance=cookie.instance_id)
    return cookie


def _warn_if_moved(config: BookieConfig, cookie: Cookie) -> None:
    journal = str(Path(config.journal_dir).resolve())
    ledger = str(Path(config.ledger_dir).resolve())
    if (journal, ledger) != (cookie.journal_dir, cookie.ledger_dir):
        _log.warning("bookie_directories_moved", bookie=cookie.bookie_id,
                     stamped=[cookie.journal_dir, cookie.ledger_dir], now=[journal, ledger])


# ---------------------------------------------------------------------- format


@dataclass(frozen=True, slots=True)
class FormatPlan:
    """What ``quorumlog bookie format`` will do; shown before it is done."""

    bookie_id: str
    meta_cookie: Cookie | None
    meta_version: int  # 0: no cookie in meta
    config: BookieConfig | None  # None: meta only, the directories are left alone

    def describe(self) -> list[str]:
        lines = [f"bookie {self.bookie_id}:"]
        if self.meta_cookie is None:
            lines.append("  meta holds no cookie for it (nothing to delete there)")
        else:
            lines.append(f"  delete its cookie in meta: {self.meta_cookie.describe()}")
        if self.config is None:
            lines.append("  leave its directories alone (no --config): wipe them yourself "
                         "before starting it")
        else:
            for path in (self.config.journal_dir, self.config.ledger_dir):
                lines.append(f"  wipe everything in {path}")
        lines.append("  its next start stamps a new instance; ledgers that had copies on it "
                     "stay under-replicated until they are re-replicated")
        return lines


def plan_format(meta: BlockingMetaClient, bookie_id: str,
                config: BookieConfig | None) -> FormatPlan:
    """Read meta; refuse while the bookie is registered (it is running)."""
    if meta.get(f"{BOOKIE_REGISTRY_PREFIX}{bookie_id}") is not None:
        raise UsageError(
            f"bookie {bookie_id} is registered in meta, so it is running: stop it first. "
            "(A bookie stopped a moment ago stays registered until its meta session "
            "expires, session_ttl_ms in its config; try again after that)")
    kv = meta.get(cookie_key(bookie_id))
    if kv is None:
        return FormatPlan(bookie_id, None, 0, config)
    try:
        cookie: Cookie | None = Cookie.decode(kv.value, source=f"meta key {kv.key}")
    except QuorumlogError:
        cookie = None  # damaged: deleting it is the way out
    return FormatPlan(bookie_id, cookie, kv.version, config)


def run_format(meta: BlockingMetaClient, plan: FormatPlan, *,
               clock: Clock = SYSTEM_CLOCK) -> list[Path]:
    """Wipe the directories (if a config was given), then delete meta's cookie
    and record the bookie's limbo floor (one transaction).

    In this order: a failure in between leaves blank directories and meta's
    cookie, which the bookie refuses as a wiped disk, and running format
    again finishes the job. The delete is a compare-and-swap on the version
    the plan read, so a cookie claimed since is never deleted.
    """
    removed = wipe_directories(plan.config) if plan.config is not None else []
    # Ledgers with ids below the floor may name this bookie and have had entries
    # on the wiped instance: the new instance keeps them in limbo (_limbo.py).
    limbo = LimboRecord(
        bookie_id=plan.bookie_id, ledger_id_floor=meta.next_id(LEDGER_ID_COUNTER),
        formatted_at_ms=clock.wall_ms(),
        previous_instance_id=plan.meta_cookie.instance_id if plan.meta_cookie else "")
    key = cookie_key(plan.bookie_id)
    compares = [Compare(key=key, target=CompareTarget.VERSION, op=CompareOp.EQUAL,
                        version=plan.meta_version)]
    success: list[PutOp | DeleteOp] = [PutOp(key=limbo_key(plan.bookie_id),
                                             value=limbo.encode())]
    if plan.meta_version:
        success.append(DeleteOp(key=key))
    result = meta.txn(compares=compares, success=success)
    if not result.succeeded:
        raise UsageError(
            f"the cookie of bookie {plan.bookie_id} changed in meta while formatting "
            "(the bookie started again?); nothing was changed in meta; stop the bookie "
            "and run format again")
    return removed
