"""The engine's parts are named where they are handed in: a class of ``agent/engine/`` whose
``__init__`` takes four or more collaborators takes them by keyword only, so a call site says
which is which (``Engine(schedule=..., journal=...)``) and two of one type cannot be swapped
unseen. Dataclasses are records built by keyword where they are made; Python 3.9 (the frozen
agent's floor) has no keyword-only dataclass fields to enforce it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from typing import List

import vmr_handler.agent.engine as engine_package

#: More positional parameters than this (``self`` apart) must be keyword-only.
MAX_POSITIONAL = 3


def _classes_with_init() -> List[type]:
    found = []
    for info in pkgutil.iter_modules(engine_package.__path__):
        module = importlib.import_module(f"{engine_package.__name__}.{info.name}")
        for _name, cls in inspect.getmembers(module, inspect.isclass):
            mine = cls.__module__ == module.__name__
            if mine and "__init__" in vars(cls) and not dataclasses.is_dataclass(cls):
                found.append(cls)
    return found


def test_the_engine_and_data_placement_are_among_the_classes_checked() -> None:
    names = {cls.__name__ for cls in _classes_with_init()}
    assert {"Engine", "DataPlacement", "EntryLauncher"} <= names, names


def test_no_engine_part_takes_four_or_more_collaborators_by_position() -> None:
    offenders = {}
    for cls in _classes_with_init():
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) > MAX_POSITIONAL:
            offenders[f"{cls.__module__}.{cls.__qualname__}"] = positional
    assert not offenders, f"take these by keyword only (after `*`): {offenders}"
