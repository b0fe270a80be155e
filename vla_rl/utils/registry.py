"""A named registry for the places users plug in (policies, simulators, advantage estimators,
policy losses, rewards, trajectory encoders, DAG node functions).

Usage, as verl does for its advantage estimators::

    ADVANTAGE_ESTIMATORS = Registry("advantage estimator")

    @ADVANTAGE_ESTIMATORS.register("grpo")
    def compute_grpo_outcome_advantage(...): ...

    fn = ADVANTAGE_ESTIMATORS.get("grpo")
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """Raised for an unknown or duplicated registry name; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly.
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Maps names to registered objects (functions or classes).

    Args:
        kind: what is registered, used in error messages (e.g. ``"policy"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[Hashable, T] = {}

    def register(self, name: Hashable) -> Callable[[T], T]:
        """Decorator registering the decorated object under ``name``.

        Raises:
            RegistryError: if ``name`` is already registered.
        """

        def decorator(obj: T) -> T:
            if name in self._entries:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: Hashable) -> T:
        """Return the object registered under ``name``.

        Raises:
            RegistryError: if ``name`` is unknown; the message lists the known names.
        """
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(map(str, self._entries))) or "none"
            raise RegistryError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def __contains__(self, name: Hashable) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        return iter(sorted(self._entries, key=str))

    def names(self) -> list[Hashable]:
        """The registered names, sorted."""
        return list(self)
