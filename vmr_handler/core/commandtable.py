"""One command table per command line, its modules imported lazily (pip's ``commands_dict``).

Each CLI (``vmr-handler``: :mod:`vmr_handler.agent.cli.commandline`, ``vmr-host``:
:mod:`vmr_handler.host.cli.vmr_host`) keeps one ``Dict[str, Command]``: the command's name,
its one-line summary (what ``--help`` lists), where its arguments are added and where it runs,
as ``"module:function"`` text. Help, shell completion and dispatch all read the table:

* :func:`build_parser` registers every command with its summary, but imports and fills only the
  parser of the command being run (or all of them, for completion and tests), so running one
  command imports only that command's module and what it needs;
* :func:`command_word` finds that command in the words (the global flags take no value);
* :func:`resolve` imports a ``"module:function"``.

Imports only ``importlib`` (and ``argparse`` types for the checker): the lean control commands
(``status``, ``resume``) go through here too.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

if TYPE_CHECKING:  # the parser is built only when a command is parsed (``plan --json`` skips it)
    import argparse

#: ``build_parser(..., only=ALL)``: fill every command's parser (completion, tests).
ALL = "*"


class Command(NamedTuple):
    """One row of a command table.

    Attributes:
        summary: the line ``--help`` lists the command with.
        arguments: ``"module:function"`` that adds the command's arguments to its parser.
        run: ``"module:function"`` that runs the parsed ``argparse.Namespace``; the exit code.
        lean: starts with no logging set up (the control commands: nothing to log, quick start).
        rest: the words after the first ``--`` are the command's own, taken as they are
            (``args.rest``, None without ``--``): ``vmr-host exec VM -- CMD ARG``.
    """

    summary: str
    arguments: str
    run: str
    lean: bool = False
    rest: bool = False


def resolve(ref: str) -> Callable[..., Any]:
    """The function named by ``"module:function"`` (its module imported now)."""
    module, _, name = ref.partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return found


def command_word(words: Sequence[str], table: Dict[str, Command]) -> Optional[str]:
    """The command named in ``words`` (the first word that is not an option), or None."""
    word = next((w for w in words if not w.startswith("-")), None)
    return word if word in table else None


def split_rest(words: Sequence[str], command: Optional[Command]) -> Tuple[List[str], Optional[List[str]]]:
    """``words`` without the command's own words after its first ``--`` (:attr:`Command.rest`),
    and those words (None: the command takes none, or there is no ``--``)."""
    if command is None or not command.rest or "--" not in words:
        return list(words), None
    cut = list(words).index("--")
    return list(words[:cut]), list(words[cut + 1 :])


def completion_command(prog: str, run: str) -> Command:
    """The ``completion SHELL`` row of ``prog``'s table (``run``: prints the script of the
    whole parser, :func:`vmr_handler.core.completion.completion_script`)."""
    summary = f"print a shell completion script for {prog} (bash, zsh, tcsh)"
    return Command(summary, "vmr_handler.core.completion:add_arguments", run, lean=True)


def top_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The parser of ``prog`` with the global flags both CLIs have: ``--version`` and ``-v``."""
    import argparse

    from vmr_handler import __version__

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=f"{prog} {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def build_parser(
    parser: argparse.ArgumentParser, table: Dict[str, Command], only: Optional[str]
) -> argparse.ArgumentParser:
    """``parser`` (the global flags already added) with one sub-command per row of ``table``,
    in the table's order; only the parser of command ``only`` (every one with :data:`ALL`, none
    with None) gets its arguments, so only that command's module is imported."""
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in table.items():
        p = sub.add_parser(name, help=command.summary)
        if only in (ALL, name):
            resolve(command.arguments)(p)
    return parser
