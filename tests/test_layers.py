"""The code's shape holds: layers, no import cycle, one error tree (docs/architecture.md).

The layer contracts live in pyproject.toml (``[tool.importlinter]``); import-linter and its
graph library grimp see every import, lazy ones inside functions included.
"""

from __future__ import annotations

import ast
import builtins
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


#: Builtin exceptions the package may raise itself: the ends of abstract methods and the exit
#: codes of ``python -m``. argparse's own ``ArgumentTypeError`` (in ``type=`` functions) is not
#: a builtin, so it passes; every other error raised on purpose is a VmrError subclass (a
#: subclass may also be a ValueError or an OSError where callers rely on that).
BUILTINS_ALLOWED = {"NotImplementedError", "SystemExit"}
BUILTIN_EXCEPTIONS = {
    name
    for name, obj in vars(builtins).items()
    if inspect.isclass(obj) and issubclass(obj, BaseException) and name not in BUILTINS_ALLOWED
}


def _raised_name(node: ast.Raise) -> str:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return exc.id if isinstance(exc, ast.Name) else ""


def test_every_error_raised_on_purpose_derives_from_vmr_error() -> None:
    """No ``raise ValueError(...)`` (or any builtin exception) in the package: errors raised on
    purpose are VmrError subclasses; re-raising a caught exception (``raise``, ``raise exc``)
    is fine."""
    package = REPO / "vmr_handler"
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                name = _raised_name(node)
                if name in BUILTIN_EXCEPTIONS:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: raise {name}")
    assert not found, "builtin exceptions raised on purpose (use a VmrError subclass):\n" + "\n".join(found)


def test_the_error_tree_names_every_error() -> None:
    import re

    from vmr_handler.core import errors

    drawn = set(re.findall(r"\+-- (\w+)", errors.__doc__ or ""))
    classes = {n for n, c in vars(errors).items() if inspect.isclass(c) and issubclass(c, VmrError)}
    assert classes - {"VmrError"} == drawn


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


def test_no_merge_conflict_markers_are_left_in_the_tree() -> None:
    """A merge left half-done never lands: no tracked text file holds a conflict marker line."""
    root = Path(__file__).resolve().parent.parent
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True)
    files = listed.stdout.splitlines()
    marked = []
    for name in files:
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary (images) or gone
        if any(line.startswith(("<<<<<<< ", ">>>>>>> ")) for line in text.splitlines()):
            marked.append(name)
    assert marked == []
