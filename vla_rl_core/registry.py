"""A named registry for the places users plug in (policies, simulators, advantage estimators,
policy losses, rewards, trajectory encoders, DAG node functions).

Usage, as verl does for its advantage estimators::

    ADVANTAGE_ESTIMATORS = Registry("advantage estimator")

    @ADVANTAGE_ESTIMATORS.register("grpo")
    def compute_grpo_outcome_advantage(...): ...

    fn = ADVANTAGE_ESTIMATORS.get("grpo")

A component with settings registers its typed config class with it (a dataclass or a pydantic
model, validated when a template loads: :mod:`vla_rl.components`)::

    @ADVANTAGE_ESTIMATORS.register("gae", config=GAEConfig)
    def compute_gae_advantage_return(..., config: GAEConfig, ...): ...
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """Raised for an unknown or duplicated registry name; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly.
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Maps names to registered objects (functions or classes).

    Args:
        kind: what is registered, used in error messages (e.g. ``"policy"``).
        builtins: modules whose import registers the built-in entries (e.g.
            ``("policies.mlp.modeling_mlp",)``). They are imported on the first lookup (:meth:`get`,
            ``in``, iteration, :meth:`metadata`, :meth:`config_class`), never by :meth:`register`, so
            that the module defining a registry does not import its implementations: a family's
            registry can sit on a low floor while its built-ins live above it.
    """

    def __init__(self, kind: str, builtins: Sequence[str] = ()) -> None:
        self.kind = kind
        self.builtins = tuple(builtins)
        self._builtins_loaded = not self.builtins
        self._entries: dict[Hashable, T] = {}
        self._configs: dict[Hashable, type] = {}
        self._metadata: dict[Hashable, dict[str, Any]] = {}

    def load_builtins(self) -> None:
        """Import the :attr:`builtins` modules (once; a lookup while they import sees what is
        registered so far). An import that fails is raised, and retried at the next lookup."""
        if self._builtins_loaded:
            return
        self._builtins_loaded = True
        try:
            for module in self.builtins:
                importlib.import_module(module)
        except BaseException:
            self._builtins_loaded = False
            raise

    def register(self, name: Hashable, config: type | None = None, **metadata: Any) -> Callable[[T], T]:
        """Decorator registering the decorated object under ``name``.

        Args:
            name: the name templates and code select it by.
            config: the typed config class of its settings (None: it takes none).
            metadata: what the component declares to the engine, by convention of its registry
                (e.g. ``reads=("values",)``: the batch keys an advantage estimator reads beyond
                the common ones; ``resources=("trajectory_encoder",)``: what a reward needs).

        Raises:
            RegistryError: if ``name`` is already registered.
        """

        def decorator(obj: T) -> T:
            if name in self._entries:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            if config is not None:
                self._configs[name] = config
            self._metadata[name] = dict(metadata)
            return obj

        return decorator

    def metadata(self, name: Hashable) -> dict[str, Any]:
        """What ``name`` declared when it was registered (see :meth:`register`).

        Raises:
            RegistryError: if ``name`` is unknown.
        """
        self.get(name)
        return dict(self._metadata.get(name, {}))

    def config_class(self, name: Hashable) -> type | None:
        """The config class registered with ``name`` (None if it takes no settings).

        Raises:
            RegistryError: if ``name`` is unknown.
        """
        self.get(name)
        return self._configs.get(name)

    def get(self, name: Hashable) -> T:
        """Return the object registered under ``name``.

        Raises:
            RegistryError: if ``name`` is unknown; the message lists the known names.
        """
        self.load_builtins()
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(map(str, self._entries))) or "none"
            raise RegistryError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def __contains__(self, name: Hashable) -> bool:
        self.load_builtins()
        return name in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        self.load_builtins()
        return iter(sorted(self._entries, key=str))

    def names(self) -> list[Hashable]:
        """The registered names, sorted."""
        return list(self)
