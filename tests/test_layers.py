"""The code's shape holds: layers, no import cycle, one error tree (docs/architecture.md).

The layer contracts live in pyproject.toml (``[tool.importlinter]``); import-linter and its
graph library grimp see every import, lazy ones inside functions included.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import List, Set, Tuple

import grimp

import vmr_handler
from vmr_handler.core.errors import VmrError

REPO = Path(__file__).resolve().parent.parent


def test_layer_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


def _cycles(graph: grimp.ImportGraph) -> List[Tuple[str, str]]:
    found: Set[Tuple[str, str]] = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(importer=imported, imported=module):
                found.add(tuple(sorted((module, imported))))  # type: ignore[arg-type]
    return sorted(found)


def test_no_import_cycle_lazy_and_type_checking_imports_included() -> None:
    graph = grimp.build_graph("vmr_handler", exclude_type_checking_imports=False)
    cycles = _cycles(graph)
    detail = [" -> ".join(graph.find_shortest_chain(importer=b, imported=a) or ()) for a, b in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(detail)


def _modules() -> List[str]:
    return [m.name for m in pkgutil.walk_packages(vmr_handler.__path__, "vmr_handler.")]


def test_every_public_exception_derives_from_vmr_error() -> None:
    outside = []
    for name in _modules():
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if attr.startswith("_") or not inspect.isclass(obj) or not issubclass(obj, BaseException):
                continue
            if obj.__module__.startswith("vmr_handler") and not issubclass(obj, VmrError):
                outside.append(f"{obj.__module__}.{attr}")
    assert not outside, f"exceptions outside VmrError: {sorted(set(outside))}"


# The packages whose __init__ re-exports names of their modules; every other __init__ is a
# docstring and nothing else (importing a package costs nothing: the lean command paths).
REEXPORTING = {"vmr_handler", "vmr_handler.core.schedule", "vmr_handler.host.report"}


def test_every_package_says_what_it_holds_and_what_it_may_import() -> None:
    import ast
    import re

    faults = []
    packages = ["vmr_handler"] + [
        m.name for m in pkgutil.walk_packages(vmr_handler.__path__, "vmr_handler.") if m.ispkg
    ]
    for name in packages:
        folder = REPO.joinpath(*name.split("."))
        tree = ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree) or ""
        if not doc.strip():
            faults.append(f"{name}: no docstring (what it holds, what it may import)")
            continue
        if not re.search(r"^May import:", doc, re.MULTILINE):
            faults.append(f"{name}: no 'May import:' line")
        children = [c for _, c, _ in pkgutil.iter_modules([str(folder)]) if c != "__main__"]
        for child in children:
            if not re.search(rf"(?<![A-Za-z0-9]){re.escape(child.lstrip('_'))}(?![A-Za-z0-9_])", doc):
                faults.append(f"{name}: its docstring does not name {child}")
        if name not in REEXPORTING and len(tree.body) > 1:
            faults.append(f"{name}: __init__.py holds more than its docstring")
    assert not faults, "\n".join(faults)
