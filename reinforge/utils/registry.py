"""Named registries: the one place where a family of interchangeable parts is listed.

Advantage estimators, policy losses, rollout backends (and later preference losses and
tools) are each a :class:`Registry`. Adding one is a function plus its registration; the
config validates names against the registry, and an unknown name is an error that lists the
registered ones (verl's ``register_adv_est`` / ``_ROLLOUT_REGISTRY`` pattern).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


def did_you_mean(name: str, options: Iterator[str] | list[str]) -> str:
    """``" (did you mean 'x'?)"``: the closest of ``options`` to a mistyped ``name`` (``difflib``, at
    most two), or ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(options), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


@dataclass
class Entry(Generic[T]):
    """A registered part: the object (or a lazy ``"module:attr"`` path) and its properties."""

    name: str
    target: T | str
    info: dict[str, Any] = field(default_factory=dict)

    def load(self) -> T:
        """The registered object; a ``"module:attr"`` target is imported now (and kept)."""
        if isinstance(self.target, str):
            module, _, attr = self.target.partition(":")
            self.target = getattr(importlib.import_module(module), attr)
        return self.target  # type: ignore[return-value]


class Registry(Generic[T]):
    """``name -> Entry``; ``kind`` names the family in error messages ("advantage estimator")."""

    def __init__(self, kind: str, config_key: str):
        self.kind, self.config_key = kind, config_key
        self._entries: dict[str, Entry[T]] = {}

    @overload
    def register(self, name: str, target: None = None, **info: Any) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, target: T | str, **info: Any) -> None: ...

    def register(self, name: str, target: T | str | None = None, **info: Any) -> Callable[[T], T] | None:
        """Register ``target`` under ``name`` (with properties ``info``); without ``target``,
        a decorator. A ``"module:attr"`` string target is imported only when first used.

        Raises:
            ValueError: ``name`` is taken.
        """

        def add(obj: T | str) -> T | str:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = Entry(name, obj, dict(info))
            return obj

        if target is None:
            return add  # type: ignore[return-value]
        add(target)
        return None

    def entry(self, name: str) -> Entry[T]:
        """Raises KeyError naming the config key and the registered names."""
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"{self.config_key}: unknown {self.kind} {name!r}{did_you_mean(name, self.names())}; registered: "
                f"{', '.join(self.names())}"
            ) from None

    def get(self, name: str) -> T:
        return self.entry(name).load()

    def info(self, name: str) -> dict[str, Any]:
        return self.entry(name).info

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
