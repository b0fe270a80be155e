"""Load a DAG template: read the YAML, resolve ``extends``, apply dotted overrides, validate.

A template is named either by a path (``path/to/x.yaml``, used as is) or by a bare name (``x``,
read from ``<repo>/dag_templates/x.yaml``).

``extends: base.yaml`` (a path relative to the extending file, or the bare name of a shipped
template, ``extends: embodied_srpo``), or a list of them merged in order, composes templates: the
``config:`` sections are deep-merged (the extending file wins), and nodes are merged by id: a node
entry whose id the base already has overrides that node's fields (mappings such as the node's
``config:`` are deep-merged, other values replaced; ``config: null`` drops the base's settings of
the node), a new id is appended after the base's nodes. A base may hold only nodes of some phases
(the files of ``dag_templates/phases/``: warm start and evaluation), so a workflow includes them by
listing them, or only config (``dag_templates/bases/``: settings that templates of several
workflows share).

Overrides use OmegaConf's dotlist syntax. ``trainer.total_steps=5`` sets a key of ``config:``;
``nodes.<id>.<field>=value`` sets a field of the node with that id (``nodes.reward.dp_size=1``,
``nodes.reward.config.reward=success``). A mapping value merges into the template's, as a base
merges into an extending template. ``~KEY`` (Hydra's syntax) deletes the key the template (or its
bases) sets, so that it takes its default: ``~policy.config`` resets the policy's settings,
``~algorithm.filter_groups`` the run's group filters, ``~nodes.<id>.config`` a node's.
:func:`check_deletion_order` (the command line's) refuses a deletion given after an override it
would discard.

The modules listed in ``config.run.imports`` are imported before the template is validated, so
that components they register (docs/extending.md) resolve.

Every problem is a :class:`~vla_rl.dag.errors.TemplateError` naming the file, node and field.
"""

from __future__ import annotations

import copy
import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError

from vla_rl.config import RunConfig
from vla_rl.config.algorithm import current_setting
from vla_rl.dag.errors import TemplateError, from_validation_error
from vla_rl.dag.schema import NodeSpec, TemplateSpec
from vla_rl.dag.yaml_values import MisreadYAMLError, NestedTooDeeply, load_yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_DIR = REPO_ROOT / "dag_templates"
"""Where bare template names are looked up."""

_TEMPLATE_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Template:
    """A loaded, validated template.

    Attributes:
        name: the workflow's name.
        path: the absolute path of the template file.
        config: the validated global configuration (an instance of the loader's config model).
        nodes: the nodes, in file order (base template's nodes first).
        raw: the merged mapping (``extends`` resolved, overrides applied, no ``extends`` key);
            written out as YAML it loads back to the same template.
        description: the template's free-text description.
        overrides: the command's own dotted overrides (``load_template``'s ``overrides``, not its
            ``recorded``): the planner refuses one that sets a setting only nodes the template
            lacks read (:func:`vla_rl.dag.planner.plan`).
    """

    name: str
    path: Path
    config: BaseModel
    nodes: tuple[NodeSpec, ...]
    raw: dict[str, Any]
    description: str = ""
    overrides: tuple[str, ...] = ()


def available_templates(directory: Path | None = None) -> list[str]:
    """The names of the templates in ``directory`` (default :data:`TEMPLATE_DIR`), sorted."""
    directory = TEMPLATE_DIR if directory is None else directory
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.iterdir() if p.suffix in _TEMPLATE_SUFFIXES)


def resolve_template_path(path_or_name: str | os.PathLike[str]) -> Path:
    """The file a template argument names: a path if it looks like one, else a name in
    :data:`TEMPLATE_DIR`.

    Raises:
        TemplateError: if the file does not exist (the message lists the available names).
    """
    text = os.fspath(path_or_name)
    path = TEMPLATE_DIR / f"{text}.yaml" if _is_template_name(text) else Path(text)
    if not path.is_file():
        names = ", ".join(available_templates()) or "none"
        raise TemplateError(f"template not found; available templates in {TEMPLATE_DIR}: {names}", file=path)
    return path.resolve()


def load_template(
    path_or_name: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    *,
    recorded: Sequence[str] = (),
) -> Template:
    """Load, merge, override and validate a template.

    Args:
        path_or_name: a template file path, or a bare name in ``dag_templates/``.
        overrides: dotted ``KEY=VALUE`` overrides (see the module docstring), the command's own:
            one that sets a setting the run never reads is refused (here, and by the planner).
        recorded: overrides applied before ``overrides`` and not checked so: those an earlier
            command recorded (a run's resumes, the workers' copy of the driver's), which a later
            command cannot take back.

    Raises:
        TemplateError: for any problem with the file, its bases, the overrides or the values.
    """
    path = resolve_template_path(path_or_name)
    raw = _load_merged(path, chain=())
    raw = apply_overrides(raw, [*recorded, *overrides], file=path)
    _import_plugins(raw, path)
    try:
        spec = TemplateSpec.model_validate(raw)
    except ValidationError as exc:
        raise _spec_error(exc, raw, path) from None
    try:
        config = RunConfig.model_validate(spec.config)
    except ValidationError as exc:
        error = from_validation_error(exc, model=RunConfig, file=path)
        given = override_of(overrides, error.field)  # a typed override's, not the file's (a resume's template.yaml)
        if given is not None and repr(given) not in error.message:
            error = TemplateError(f"{error.message} (override {given!r})", file=path, field=error.field)
        raise error from None
    _check_overrides_read(config, overrides, path, spec.nodes)
    return Template(name=spec.name, path=path, config=config, nodes=spec.nodes, raw=raw,
                    description=spec.description, overrides=tuple(overrides))


def _check_overrides_read(config: BaseModel, overrides: Sequence[str], file: Path, nodes: Sequence[NodeSpec]) -> None:
    """Refuse an override of a setting the validated ``config`` says the run never reads (its
    ``unread_settings()``, when the config model has one): typed on the command line, it would be
    ignored silently. A plug-in node function of the template that declares the setting in its
    ``settings`` reads it (:func:`_read_by_plugin`)."""
    unread = getattr(config, "unread_settings", None)
    if unread is None or not overrides:
        return
    for setting, why in unread().items():
        for item, key in override_settings(overrides):
            if (key == setting or key.startswith(f"{setting}.")) and not _read_by_plugin(key, nodes):
                raise TemplateError(f"override {item!r} is never read: {why}", file=file, field=key)


def _read_by_plugin(key: str, nodes: Sequence[NodeSpec]) -> bool:
    """Whether a node of ``nodes`` runs a plug-in's function (one registered outside vla_rl) that
    declares ``key``, a setting under it or a section above it in its ``settings``: the built-in
    functions' conditions are the config's own (``text.sft_lr`` is read only with
    ``text.sft_steps``), a plug-in's are not known."""
    from vla_rl.dag.registry import get_node_function
    from vla_rl_core.registry import RegistryError

    for node in nodes:
        try:
            function = get_node_function(node.role, node.type, node.fn)
        except RegistryError:  # the planner names it
            continue
        if getattr(function.fn, "__module__", "").split(".")[0] != "vla_rl" and any(
                key == setting or key.startswith(f"{setting}.") or setting.startswith(f"{key}.")
                for setting in function.settings):
            return True
    return False


def override_of(overrides: Sequence[str], field: str | None) -> str | None:
    """The override that sets ``field`` (``eval.protocols[0]``: ``eval.protocols``) or a setting above
    or below it, if one does."""
    field = field.split("[", 1)[0] if field else None
    for item in overrides if field else ():
        key = item.split("=", 1)[0].removeprefix("~")
        if key == field or field.startswith(f"{key}.") or key.startswith(f"{field}."):
            return item
    return None


def override_settings(overrides: Sequence[str]) -> list[tuple[str, str]]:
    """``(override, the dotted setting it sets)`` for each ``KEY=VALUE`` override of ``config:``
    (a moved flat key as its new place: :func:`~vla_rl.config.algorithm.current_setting`); a
    deletion (``~KEY``: of a setting never read, harmless) and a node's field are left out."""
    settings = []
    for item in overrides:
        key = item.partition("=")[0]
        if not item.startswith("~") and key.split(".")[0] != "nodes":
            settings.append((item, current_setting(key)))
    return settings


def _import_plugins(raw: dict[str, Any], file: Path) -> None:
    """Import the modules of ``config.run.imports`` (they register components the config names)."""
    run = raw.get("config", {}).get("run", {})
    modules = run.get("imports", []) if isinstance(run, dict) else []
    if not isinstance(modules, list) or not all(isinstance(m, str) and m for m in modules):
        raise TemplateError(f"must be a list of module names (got {modules!r})", file=file, field="run.imports")
    if modules:
        # the built-in node functions and the workflows' resources first: a plug-in registering one
        # of their names is then refused at its own import, naming it, rather than the built-in
        # failing later as the one that registers "another"
        from vla_rl.dag.registry import NODE_FUNCTIONS, WORKFLOWS

        NODE_FUNCTIONS.load_builtins()
        WORKFLOWS.load_builtins()
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # any failure of the user's module is reported in one line
            raise TemplateError(f"cannot import {module!r}: {type(exc).__name__}: {exc}{not_on_path(module, exc)}",
                                file=file, field="run.imports") from None


def not_on_path(module: str, error: Exception) -> str:
    """The hint for a plug-in ``module`` that was not found itself (not a module it imports): its
    folder is on no import path; "" for any other error."""
    if not isinstance(error, ModuleNotFoundError) or error.name is None or not (
            module == error.name or module.startswith(error.name + ".")):
        return ""
    return (f" (is the folder holding {module.split('.')[0]} on PYTHONPATH? e.g. PYTHONPATH=. in front of the "
            "command run from that folder)")


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str], *, file: Path) -> dict[str, Any]:
    """Return a copy of the template mapping ``raw`` with dotted overrides applied.

    Raises:
        TemplateError: for an override without ``=``, with an empty key part or no value (``KEY=``:
            ``KEY=null`` sets null), one that names an unknown node id, one that would rename a node,
            ``KEY={}`` over a non-empty mapping (it would change nothing: ``~KEY`` resets it), or a
            ``~KEY`` that deletes nothing (and was not deleted earlier in the list), a node, or a
            node's id, role or type.
    """
    raw = copy.deepcopy(raw)
    nodes = _node_index(raw.get("nodes", []), file)
    deleted: list[str] = []  # the keys deleted so far: deleting one again (a resume repeating an
    for item in overrides:   # earlier resume's ~KEY) is no mistake
        if item.startswith("~"):
            key = item[1:]
            if not any(key == gone or key.startswith(f"{gone}.") for gone in deleted):
                _delete(raw, nodes, item, file)
            deleted.append(key)
            continue
        key, sep, text = item.partition("=")
        parts = key.split(".")
        if not sep or not all(parts):
            raise TemplateError(
                f"malformed override {item!r}: expected KEY=VALUE with a dotted KEY, e.g. trainer.total_steps=5",
                file=file,
                field=key or None,
            )
        if not text.strip():  # OmegaConf reads it as null: an unset shell variable ($TRAIN) nulled the setting
            raise TemplateError(f"override {item!r} has no value: write {key}=null for null, {key}=\"''\" for an "
                                "empty string", file=file, field=key)
        try:  # OmegaConf reads YAML 1.1: its readings that differ from what the value shows are refused
            load_yaml(text)
        except MisreadYAMLError as exc:
            raise TemplateError(f"override {item!r}: {exc.problem}", file=file, field=key) from None
        except NestedTooDeeply as exc:  # OmegaConf's reading would end in a RecursionError too
            raise TemplateError(f"override {key}=...: {exc}", file=file, field=key) from None
        except yaml.YAMLError:
            pass  # OmegaConf's own reading says what is wrong
        try:
            value = OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=False)
        except (OmegaConfBaseException, yaml.YAMLError) as exc:  # from_dotlist parses the value as YAML
            reason = " ".join(str(exc).split())
            raise TemplateError(f"malformed override {item!r}: {reason}", file=file, field=key) from None
        if text.strip() == "{}" and isinstance(current := _value_at(raw, parts), dict) and current:
            raise TemplateError(f"override {item!r} changes nothing: a mapping merges into the template's; to reset "
                                f"{key} to its defaults write ~{key}", file=file, field=key)
        if parts[0] != "nodes":
            raw["config"] = _deep_merge(raw.get("config", {}), value)
            continue
        if len(parts) < 3:
            raise TemplateError(
                f"malformed override {item!r}: name a node and a field, e.g. nodes.reward.dp_size=1",
                file=file,
                field=key,
            )
        node_id, field = parts[1], ".".join(parts[2:])
        if node_id not in nodes:
            raise TemplateError(
                f"override {item!r} names an unknown node; nodes: {', '.join(nodes)}",
                file=file,
                node=node_id,
                field=field,
            )
        if parts[2] == "id":
            raise TemplateError(f"override {item!r}: a node cannot be renamed", file=file, node=node_id, field="id")
        nodes[node_id].update(_deep_merge(nodes[node_id], value["nodes"][node_id]))
    return raw


def check_deletion_order(overrides: Sequence[str]) -> None:
    """Refuse a command's ``~KEY`` given after one of its own overrides under (or above) ``KEY``:
    applied in order, the deletion would discard what the user has just set rather than the
    template's setting. Checked on one command's overrides only (a resume may undo an earlier
    resume's setting).

    Raises:
        TemplateError: naming the deletion and the override it would discard.
    """
    for i, item in enumerate(overrides):
        if not item.startswith("~"):
            continue
        key = item[1:]
        for earlier in overrides[:i]:
            set_key = earlier.partition("=")[0]
            if "=" in earlier and (set_key == key or set_key.startswith(f"{key}.") or key.startswith(f"{set_key}.")):
                raise TemplateError(f"override {item!r} would delete {earlier!r}, given before it: put {item} first "
                                    "(a deletion applies to the template's settings)", field=key)


def _value_at(raw: dict[str, Any], parts: Sequence[str]) -> Any:
    """The value an override's dotted key names in the template mapping (``config:`` keys, or
    ``nodes.<id>.<field>``), or None where the template sets none."""
    if parts[0] == "nodes":
        if len(parts) < 2:
            return None
        node = next((n for n in raw.get("nodes", []) if isinstance(n, dict) and n.get("id") == parts[1]), None)
        value, rest = node, parts[2:]
    else:
        value, rest = raw.get("config"), parts
    for part in rest:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _delete(raw: dict[str, Any], nodes: dict[str, dict[str, Any]], item: str, file: Path) -> None:
    """Apply a ``~KEY`` override: delete the key from the config or from a node."""
    key = item[1:]
    parts = key.split(".")
    if "=" in key or not all(parts):
        raise TemplateError(f"malformed override {item!r}: expected ~KEY with a dotted KEY, e.g. "
                            "~nodes.reward.config", file=file, field=key or None)
    if parts[0] == "nodes":
        if len(parts) < 3:
            raise TemplateError(f"malformed override {item!r}: a node cannot be deleted, only its fields "
                                "(~nodes.reward.config)", file=file, field=key)
        if parts[1] not in nodes:
            raise TemplateError(f"override {item!r} names an unknown node; nodes: {', '.join(nodes)}",
                                file=file, node=parts[1], field=".".join(parts[2:]))
        if parts[2] in ("id", "role", "type"):
            raise TemplateError(f"override {item!r}: a node's {parts[2]} cannot be deleted", file=file,
                                node=parts[1], field=parts[2])
        parent, path = nodes[parts[1]], parts[2:]
    else:
        parent, path = raw.setdefault("config", {}), parts
    for part in path[:-1]:
        parent = parent.get(part) if isinstance(parent, dict) else None
    if not isinstance(parent, dict) or path[-1] not in parent:
        raise TemplateError(f"override {item!r} deletes nothing: the template sets no {key}", file=file, field=key)
    del parent[path[-1]]


def _missing_base(path: Path, base: str) -> str:
    """Why ``extends: base`` of the template ``path`` names no file: every path it was looked for
    at (beside the template; for a bare name, a shipped template too), and the one meant where a
    file with ``.yaml`` added exists beside it."""
    beside = (path.parent / base).resolve()
    tried = [beside] + ([(TEMPLATE_DIR / f"{base}.yaml").resolve()] if _is_template_name(base) else [])
    what = f"{beside} is a directory" if beside.is_dir() else "base template not found"
    message = f"{what} (looked for {' and '.join(map(str, tried))})"
    if (path.parent / f"{base}.yaml").is_file():
        message += f"; the file beside it is {base}.yaml: write extends: {base}.yaml"
    return message


def _load_merged(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """Read ``path`` and, recursively, the templates it extends; return the merged mapping."""
    raw = _read_template_file(path)
    extends = raw.pop("extends", None)
    if extends is None:
        return raw
    bases = [extends] if isinstance(extends, str) else extends
    if not isinstance(bases, list) or not bases or not all(isinstance(b, str) and b for b in bases):
        raise TemplateError(f"must be a path to a template file, or a list of them (got {extends!r})",
                            file=path, field="extends")
    merged: dict[str, Any] = {}
    for base in bases:
        base_path = (path.parent / base).resolve()
        if not base_path.is_file() and _is_template_name(base):  # a shipped template, as the CLI names it
            base_path = (TEMPLATE_DIR / f"{base}.yaml").resolve()
        if base_path == path or base_path in chain:
            cycle = [*chain[chain.index(base_path) :], path, base_path] if base_path in chain else [path, path]
            names = " -> ".join(p.name for p in cycle)
            raise TemplateError(f"extends cycle: {names}", file=path, field="extends")
        if not base_path.is_file():
            raise TemplateError(_missing_base(path, base), file=path, field="extends")
        merged = _merge_templates(merged, _load_merged(base_path, (*chain, path)))
    return _merge_templates(merged, raw)


def _is_template_name(text: str) -> bool:
    """Whether ``text`` is a bare name (``embodied_srpo``), not a path."""
    return "/" not in text and os.sep not in text and Path(text).suffix not in _TEMPLATE_SUFFIXES


def _read_template_file(path: Path) -> dict[str, Any]:
    """Parse one YAML file and check the structure that merging and overrides rely on."""
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise TemplateError(f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); save the "
                            "template as UTF-8", file=path) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise TemplateError(f"invalid YAML{where}: {exc.problem or exc.context}", file=path) from None
    except yaml.YAMLError as exc:
        raise TemplateError(f"invalid YAML: {exc}", file=path) from None
    if not isinstance(raw, dict):
        raise TemplateError(f"a template must be a mapping (got {type(raw).__name__})", file=path)
    bad_keys = [k for k in raw if not isinstance(k, str)]
    if bad_keys:
        raise TemplateError(f"keys must be strings (got {bad_keys[0]!r})", file=path)
    if "config" in raw and not isinstance(raw["config"], dict):
        raise TemplateError(f"must be a mapping (got {raw['config']!r})", file=path, field="config")
    _node_index(raw.get("nodes", []), path)
    return raw


def _node_index(nodes: Any, file: Path) -> dict[str, dict[str, Any]]:
    """Map node id → node mapping (the same objects), checking that every node has a unique id."""
    if not isinstance(nodes, list):
        raise TemplateError(f"must be a list of nodes (got {nodes!r})", file=file, field="nodes")
    index: dict[str, dict[str, Any]] = {}
    for i, node in enumerate(nodes):
        if not isinstance(node, dict):
            raise TemplateError(f"a node must be a mapping (got {node!r})", file=file, field=f"nodes[{i}]")
        node_id = node.get("id")
        if not isinstance(node_id, str) or not node_id:
            got = "it is missing" if node_id is None else f"got {node_id!r}"
            raise TemplateError(
                f"every node needs a non-empty string id ({got})", file=file, field=f"nodes[{i}].id"
            )
        if node_id in index:
            raise TemplateError(f"duplicated node id (nodes[{i}])", file=file, node=node_id, field="id")
        index[node_id] = node
    return index


def _merge_templates(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """``child`` over ``base``: mappings deep-merged, nodes merged by id."""
    merged = _deep_merge(
        {k: v for k, v in base.items() if k != "nodes"}, {k: v for k, v in child.items() if k != "nodes"}
    )
    if "nodes" in base or "nodes" in child:
        nodes = {node["id"]: node for node in copy.deepcopy(base.get("nodes", []))}
        for node in child.get("nodes", []):
            node_id = node["id"]
            nodes[node_id] = _deep_merge(nodes[node_id], node) if node_id in nodes else copy.deepcopy(node)
        merged["nodes"] = list(nodes.values())
    return merged


def _deep_merge(base: Any, override: Any) -> Any:
    """``override`` over ``base``: mappings merged recursively, any other value replaced (copied)."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return copy.deepcopy(override)
    merged = copy.deepcopy(base)
    for key, value in override.items():
        merged[key] = _deep_merge(merged[key], value) if key in merged else copy.deepcopy(value)
    return merged


def _spec_error(exc: ValidationError, raw: dict[str, Any], file: Path) -> TemplateError:
    """Map a ``TemplateSpec`` validation error to the node (by id) and field it concerns."""
    loc = exc.errors()[0]["loc"]
    if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
        node_id = raw["nodes"][loc[1]]["id"]
        return from_validation_error(exc, model=NodeSpec, file=file, node=node_id, strip=2)
    return from_validation_error(exc, model=TemplateSpec, file=file)
