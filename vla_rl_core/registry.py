"""A named registry for the places users plug in (policies, simulators, advantage estimators,
policy losses, rewards, trajectory encoders, DAG node functions).

Usage, as verl does for its advantage estimators::

    ADVANTAGE_ESTIMATORS = Registry("advantage estimator")

    @ADVANTAGE_ESTIMATORS.register("grpo")
    def compute_grpo_outcome_advantage(...): ...

    fn = ADVANTAGE_ESTIMATORS.get("grpo")

A component with settings registers its typed config class with it (a dataclass or a pydantic
model, validated when a template loads: :mod:`vla_rl_core.components`)::

    @ADVANTAGE_ESTIMATORS.register("gae", config=GAEConfig)
    def compute_gae_advantage_return(..., config: GAEConfig, ...): ...

A registry whose entries the engine calls one way names that call (``calls``), so that a function
registered with another signature fails when its module is imported, naming the entry and the
arguments it is given, not inside a worker at the first step.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

T = TypeVar("T")

Call = tuple[tuple[str, ...], tuple[str, ...]]
"""How the engine calls an entry: the names of its positional arguments, then of its keyword ones."""


class RegistryError(KeyError):
    """Raised for an unknown or duplicated registry name; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly.
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Maps names to registered objects (functions or classes).

    Args:
        kind: what is registered, used in error messages (e.g. ``"policy"``).
        builtins: modules whose import registers the built-in entries (e.g.
            ``("policies.mlp.modeling_mlp",)``), or a mapping of each built-in name to its module
            (e.g. ``{"mlp": "policies.mlp.modeling_mlp"}``). They are imported on the first lookup
            (:meth:`get`, ``in``, iteration, :meth:`traits`, :meth:`config_class`), never by
            :meth:`register`, so that the module defining a registry does not import its
            implementations: a family's registry can sit on a low floor while its built-ins live
            above it. With a mapping, a lookup of a built-in name imports its own module only (a
            template of the MLP policy does not import transformers for the VLA policies: 1.8 s of
            every process that loads it, on this project's CPU machine); iteration and a lookup of
            any other name import them all. :meth:`check_builtins` checks the mapping.
        traits: the pydantic model of what each entry declares to the engine when it registers
            (e.g. an advantage estimator's ``reads`` and ``groups``); None: entries declare nothing.
        calls: how the engine calls a function entry (:data:`Call`), or a function of the entry's
            declared traits giving it (an estimator that takes batch statistics is also passed
            ``reduce``); :meth:`register` refuses a function that cannot be called so. Class
            entries (built from their config, then called) are not checked. None: no fixed call.
    """

    def __init__(self, kind: str, builtins: Sequence[str] | Mapping[Hashable, str] = (),
                 traits: type[BaseModel] | None = None,
                 calls: Call | Callable[[BaseModel | None], Call] | None = None) -> None:
        self.kind = kind
        self.builtin_modules: dict[Hashable, str] = dict(builtins) if isinstance(builtins, Mapping) else {}
        modules = self.builtin_modules.values() if isinstance(builtins, Mapping) else builtins
        self.builtins = tuple(dict.fromkeys(modules))
        self.traits_model = traits
        self.calls = calls
        self._builtins_loaded = not self.builtins
        self._entries: dict[Hashable, T] = {}
        self._configs: dict[Hashable, type] = {}
        self._traits: dict[Hashable, BaseModel] = {}

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

    def _is_builtin_module(self, module: str | None) -> bool:
        """Whether ``module`` is (in) one of the :attr:`builtins` modules or packages."""
        return module is not None and any(module == b or module.startswith(f"{b}.") for b in self.builtins)

    def _load_for(self, name: Hashable) -> None:
        """Make ``name`` registered if it is a built-in: import its own module when the built-ins
        map names to modules, else all of them."""
        module = None if self._builtins_loaded else self.builtin_modules.get(name)
        if module is None:
            self.load_builtins()
        else:
            importlib.import_module(module)

    def check_builtins(self) -> None:
        """Check that each name of the built-ins' mapping is registered by the module it names
        and that no built-in module registers a name the mapping lacks (a lookup of that name
        would import every built-in module).

        Raises:
            RegistryError: naming each name whose module differs or is missing from the mapping.
        """
        self.load_builtins()
        if not self.builtin_modules:
            return
        problems = []
        for name, entry in self._entries.items():
            module = getattr(entry, "__module__", None)
            if module in self.builtins and self.builtin_modules.get(name) != module:
                problems.append(f"{name!r} is registered by {module}, mapped to {self.builtin_modules.get(name)}")
        problems += [f"{name!r} (mapped to {module}) is not registered" for name, module in self.builtin_modules.items()
                     if name not in self._entries]
        if problems:
            raise RegistryError(f"the {self.kind} registry's built-ins: {'; '.join(problems)}")

    def register(self, name: Hashable, config: type | None = None, **traits: Any) -> Callable[[T], T]:
        """Decorator registering the decorated object under ``name``.

        Args:
            name: the name templates and code select it by.
            config: the typed config class of its settings (None: it takes none).
            traits: what the component declares to the engine, validated by the registry's
                traits model (e.g. ``reads=("values",)``: the batch keys an advantage estimator
                reads beyond the common ones), so that a misspelt or mistyped trait is an error
                when the registering module is imported, never a check silently skipped.

        Raises:
            RegistryError: if ``name`` is already registered (naming the modules of both), or is
                the name of a built-in of :attr:`builtin_modules` registered by another module (a
                plug-in, refused at its import rather than when the built-in loads).
            TypeError: traits the registry's model refuses (an unknown name, a wrong type; the
                message names the component and the trait), or any trait for a registry without one;
                a function that cannot be called as :attr:`calls` says (naming the arguments).
        """
        declared = self._validated_traits(name, traits)

        def decorator(obj: T) -> T:
            module = _origin(obj)
            # a plug-in taking a built-in's name, before the built-in has loaded: refused here, at
            # the plug-in's import, rather than later as the built-in's failure
            if module is not None and not self._is_builtin_module(module) and name in self.builtin_modules:
                raise RegistryError(f"{self.kind} {name!r} is a built-in ({self.builtin_modules[name]}); {module} "
                                    "registers another: give it another name")
            self._check_call(name, obj, declared)
            if name in self._entries:
                raise RegistryError(f"{self.kind} {name!r} is already registered (by {_origin(self._entries[name])}); "
                                    f"{module} registers another: give it another name")
            self._entries[name] = obj
            if config is not None:
                self._configs[name] = config
            if declared is not None:
                self._traits[name] = declared
            return obj

        return decorator

    def _check_call(self, name: Hashable, obj: Any, declared: BaseModel | None) -> None:
        if self.calls is None or isinstance(obj, type):
            return
        positional, keywords = self.calls(declared) if callable(self.calls) else self.calls
        check_call(f"{self.kind} {name!r}", obj, positional, keywords)

    def traits(self, name: Hashable) -> BaseModel:
        """What ``name`` declared when it was registered: an instance of the registry's traits
        model (its defaults where the entry declared nothing).

        Raises:
            RegistryError: if ``name`` is unknown.
            TypeError: if the registry has no traits model.
        """
        self.get(name)
        if self.traits_model is None:
            raise TypeError(f"the {self.kind} registry declares no traits")
        return self._traits.get(name) or self.traits_model()

    def _validated_traits(self, name: Hashable, traits: dict[str, Any]) -> BaseModel | None:
        if self.traits_model is None:
            if traits:
                raise TypeError(f"{self.kind} {name!r}: the {self.kind} registry takes no traits, got "
                                f"{sorted(traits)}")
            return None
        try:
            return self.traits_model(**traits)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise TypeError(f"{self.kind} {name!r} declares invalid traits ({self.traits_model.__name__}): "
                            f"{problems}") from None

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
        self._load_for(name)
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(map(str, self._entries))) or "none"
            raise RegistryError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def __contains__(self, name: Hashable) -> bool:
        self._load_for(name)
        return name in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        self.load_builtins()
        return iter(sorted(self._entries, key=str))

    def names(self) -> list[Hashable]:
        """The registered names, sorted."""
        return list(self)


def check_call(what: str, obj: Any, positional: Sequence[str], keywords: Sequence[str] = ()) -> None:
    """Check that ``obj`` can be called with the arguments named (positional ones, then keywords).

    Raises:
        TypeError: ``obj`` is not callable, or its signature cannot take that call; the message
            names ``what`` (e.g. ``"policy loss 'toy'"``), the function with its signature, the call
            and why.
    """
    if not callable(obj):
        raise TypeError(f"{what} must be callable, got {obj!r}")
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    try:
        signature.bind(*positional, **dict.fromkeys(keywords))
    except TypeError as err:
        call = ", ".join([*positional, *(f"{keyword}=..." for keyword in keywords)])
        where = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
        raise TypeError(f"{what} ({where}{signature}) cannot be called as the engine calls it, ({call}): "
                        f"{err}") from None


def _origin(obj: Any) -> str | None:
    """The module that defines a registered object: a function's or class's own, the callable an
    entry wraps (a node function's ``fn``, a ``functools.partial``'s ``func``, a resource's
    ``build``), or None."""
    for attribute in ("fn", "func", "build"):
        wrapped = getattr(obj, attribute, None)
        if callable(wrapped):
            obj = wrapped
            break
    return getattr(obj, "__module__", None) if callable(obj) else None
