"""A deep, comparable dump of a RaftNode's whole state (every slot, recursively)."""

from __future__ import annotations

import random
from collections import deque
from enum import Enum
from typing import Any

import msgspec


def deep_state(obj: Any) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, Enum)):
        return obj
    if isinstance(obj, random.Random):
        return obj.getstate()
    if isinstance(obj, msgspec.Struct):
        return obj  # frozen values compare by content
    if isinstance(obj, dict):
        return {key: deep_state(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple, deque)):
        return [deep_state(value) for value in obj]
    if isinstance(obj, (set, frozenset)):
        return frozenset(obj)
    if hasattr(obj, "__self__") and hasattr(obj, "__func__"):
        return f"method:{obj.__func__.__name__}"
    slots: list[str] = []
    for klass in type(obj).__mro__:
        slots.extend(getattr(klass, "__slots__", ()))
    if not slots:
        raise TypeError(f"cannot dump {type(obj).__name__}")
    return {
        "__type__": type(obj).__name__,
        **{name: deep_state(getattr(obj, name)) for name in slots if hasattr(obj, name)},
    }
