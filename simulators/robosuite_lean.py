"""Lean robosuite models for environments that never render.

A robosuite Lift environment compiles about 350 k visual mesh vertices (the Panda's and the
mount's detailed meshes) and 20 MB of textures into every MuJoCo model: measured with robosuite
1.5.2 and MuJoCo 3.3.0, about 155 MB of memory and 1.5-2 s per environment. A state-only
environment uses neither: visual geoms have ``contype = conaffinity = 0`` (no contacts), and
robosuite's robot links carry explicit ``<inertial>`` elements, so these geoms do not enter the
dynamics either. Without them an environment takes about 55 MB and half the time to create,
and its observations are bit-identical (tests/simulators/test_robosuite_lean.py checks every
task of :data:`simulators.robosuite_env.TASK_STATE_KEYS` under random actions).

:func:`strip_rendering_assets` edits the MJCF before it is compiled; :func:`lean_task_class`
gives a robosuite task class that applies it through robosuite's ``edit_model_xml`` hook.
"""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from typing import Any

PLACEHOLDER_RADIUS = "0.001"
"""Radius (metres) of the sphere that replaces a visual mesh: robosuite looks visual geoms up by
name, so they stay in the model, as points without contacts."""


def _is_visual_mesh(geom: ET.Element) -> bool:
    return geom.get("type") == "mesh" and geom.get("contype") == "0" and geom.get("conaffinity") == "0"


def strip_rendering_assets(xml: str) -> str:
    """Remove what only rendering needs from an MJCF model.

    - every visual mesh geom (``type="mesh"``, ``contype = conaffinity = 0``) becomes a
      :data:`PLACEHOLDER_RADIUS` sphere with the same name, body and other attributes;
    - mesh assets no geom uses any more are dropped;
    - texture assets are dropped and materials lose their ``texture`` attribute.

    Args:
        xml: the model's MJCF text (``<mujoco>`` root with an ``<asset>`` section).

    Returns:
        The edited MJCF text.

    Raises:
        xml.etree.ElementTree.ParseError: if ``xml`` is not well-formed.
    """
    root = ET.fromstring(xml)
    for geom in root.iter("geom"):
        if _is_visual_mesh(geom):
            del geom.attrib["mesh"]
            geom.set("type", "sphere")
            geom.set("size", PLACEHOLDER_RADIUS)
    used_meshes = {geom.get("mesh") for geom in root.iter("geom") if geom.get("mesh")}
    for asset in root.iter("asset"):
        for element in list(asset):
            if element.tag == "texture" or (element.tag == "mesh" and element.get("name") not in used_meshes):
                asset.remove(element)
        for material in asset.iter("material"):
            material.attrib.pop("texture", None)
    return ET.tostring(root, encoding="unicode")


@functools.cache
def lean_task_class(task: str) -> type:
    """The robosuite task class ``task`` with :func:`strip_rendering_assets` applied to its model.

    The subclass is removed from robosuite's environment registry (its metaclass registers every
    subclass), so ``robosuite.ALL_ENVIRONMENTS`` is unchanged.

    Args:
        task: a registered robosuite environment name, e.g. ``"Lift"``.

    Returns:
        A subclass of the task's class, constructed with the same arguments.

    Raises:
        ValueError: if ``task`` is not a registered robosuite environment.
    """
    from robosuite.environments.base import REGISTERED_ENVS

    if task not in REGISTERED_ENVS:
        raise ValueError(f"unknown robosuite task {task!r}; registered: {', '.join(sorted(REGISTERED_ENVS))}")
    base = REGISTERED_ENVS[task]

    def edit_model_xml(self: Any, xml_str: str) -> str:
        return strip_rendering_assets(base.edit_model_xml(self, xml_str))

    name = f"_{task}WithoutRenderingAssets"
    lean = type(base)(name, (base,), {"edit_model_xml": edit_model_xml, "__module__": __name__})
    REGISTERED_ENVS.pop(name, None)
    return lean
