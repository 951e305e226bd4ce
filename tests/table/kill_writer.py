"""Writes that go on while a partition leader is SIGKILLed (shared by the
table tests that kill leaders under a writer)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from quorumlog.errors import DeadlineExceededError


def write_through_kill(write: Callable[[int], None], victim_pid: int, *, before: int,
                       after: int, deadline_s: float) -> list[int]:
    """Call ``write(i)`` for i = 1, 2, ... on a thread; SIGKILL ``victim_pid``
    once ``before`` writes were acknowledged; stop ``after`` acknowledged
    writes later. Returns the acknowledged i's. Fails if a write ran out of
    its deadline or the writes did not continue after the kill (each phase
    waits at most ``deadline_s``)."""
    acknowledged: list[int] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def writer() -> None:
        i = 1
        while not stop.is_set():
            try:
                write(i)
            except DeadlineExceededError as exc:
                errors.append(exc)
                return
            acknowledged.append(i)
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    deadline = time.monotonic() + deadline_s
    while len(acknowledged) < before and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(victim_pid, signal.SIGKILL)
    killed_at = len(acknowledged)
    while len(acknowledged) < killed_at + after and time.monotonic() < deadline + deadline_s:
        time.sleep(0.05)
    stop.set()
    thread.join()
    assert not errors, errors
    assert len(acknowledged) >= killed_at + after, "writes did not continue after the kill"
    return acknowledged
