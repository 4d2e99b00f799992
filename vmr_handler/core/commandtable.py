"""One command table per command line, its modules imported lazily (pip's ``commands_dict``).

Each CLI (``vmr-handler``: :mod:`vmr_handler.agent.cli.commandline`, ``vmr-host``:
:mod:`vmr_handler.host.cli.vmr_host`) keeps one ``Dict[str, Command]``: the command's name,
its one-line summary (what ``--help`` lists), where its arguments are added and where it runs,
as ``"module:function"`` text. Help, shell completion and dispatch all read the table:

* :func:`build_parser` makes only the parser of the command being run (every command, with its
  summary, for the help; all of them with their arguments for completion and tests), so
  running one command imports only that command's module and what it needs;
* :func:`command_word` finds that command in the words (the global flags take no value);
* :func:`join_negative_values` lets an option whose declared ``type`` reads negative numbers
  take ``-inf`` or ``-1e3`` as its value, which argparse would take for an option;
* :func:`resolve` imports a ``"module:function"``.

Imports only ``importlib`` at import time, ``argparse`` when a parser is built and ``typing``
only for the checker (:data:`TYPE_CHECKING`): the lean control commands (``status``,
``resume``) go through here too.
"""

from __future__ import annotations

import importlib

#: False when run, True for the type checker (mypy takes any ``TYPE_CHECKING`` as true): the
#: lean command paths never import ``typing`` (2-3 ms), their annotations are strings.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

#: ``build_parser(..., only=ALL)``: fill every command's parser (completion, tests).
ALL = "*"


class Command:
    """One row of a command table (a plain class: a ``NamedTuple`` costs the lean commands
    about a millisecond to define).

    Attributes:
        summary: the line ``--help`` lists the command with.
        arguments: ``"module:function"`` that adds the command's arguments to its parser.
        run: ``"module:function"`` that runs the parsed ``argparse.Namespace``; the exit code.
        lean: starts with no logging set up (the control commands, ``plan``, ``check``: nothing
            to log, a quick start; their modules import no ``typing``, :data:`TYPE_CHECKING`).
        rest: the words after the first ``--`` are the command's own, taken as they are
            (``args.rest``, None without ``--``): ``vmr-host exec VM -- CMD ARG``.
    """

    __slots__ = ("arguments", "lean", "rest", "run", "summary")

    def __init__(
        self, summary: str, arguments: str, run: str, lean: bool = False, rest: bool = False
    ) -> None:
        self.summary = summary
        self.arguments = arguments
        self.run = run
        self.lean = lean
        self.rest = rest


def resolve(ref: str) -> Callable[..., Any]:
    """The function named by ``"module:function"`` (its module imported now)."""
    module, _, name = ref.partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return found


def command_word(words: Sequence[str], table: Dict[str, Command]) -> Optional[str]:
    """The command named in ``words`` (the first word that is not an option), or None."""
    word = next((w for w in words if not w.startswith("-")), None)
    return word if word in table else None


def join_negative_values(
    words: Sequence[str], parser: argparse.ArgumentParser, value_type: Callable[[str], Any]
) -> List[str]:
    """``words`` with ``OPTION VALUE`` written ``OPTION=VALUE`` where ``OPTION`` is an option
    string of ``parser`` (or of its sub-parsers) declared with ``type=value_type``, or an
    abbreviation of only that one, and ``VALUE`` a number starting with ``-`` (``-inf``,
    ``-1e3``; ``-nan`` too: ``value_type`` then says what is wrong with it). argparse takes a
    word starting with ``-`` for an option unless it looks like ``-5`` or ``-.5``; joined, it is
    the option's value. Words after ``--`` are left as they are."""
    typed, every = _options_of_type(parser, value_type)
    out = list(words)
    i = 0
    while i < len(out) - 1 and out[i] != "--":
        option, value = out[i], out[i + 1]
        if value.startswith("-") and _is_number(value) and _names_one_of(option, typed, every):
            out[i : i + 2] = [f"{option}={value}"]
        i += 1
    return out


def _options_of_type(
    parser: argparse.ArgumentParser, value_type: Callable[[str], Any]
) -> Tuple[Set[str], Set[str]]:
    """The option strings declared with ``type=value_type``, and all option strings, of
    ``parser`` and its sub-parsers (those it made: :func:`build_parser` makes only the
    command's). Reads ``parser._actions``, as shtab and argcomplete do: argparse lists them
    nowhere else."""
    typed: Set[str] = set()
    every: Set[str] = set()
    parsers = [parser]
    while parsers:
        for action in parsers.pop()._actions:
            every.update(action.option_strings)
            if action.type is value_type:
                typed.update(action.option_strings)
            if isinstance(action.choices, dict):  # the sub-parsers, by command name
                parsers.extend(action.choices.values())
    return typed, every


def _names_one_of(word: str, typed: Set[str], every: Set[str]) -> bool:
    """True when ``word`` is one of ``typed``, or a ``--`` abbreviation of one of them and of no
    other option of ``every`` (argparse's ``allow_abbrev``)."""
    if word in typed:
        return True
    if not word.startswith("--") or "=" in word or word in every:
        return False
    matches = [option for option in every if option.startswith(word)]
    return len(matches) == 1 and matches[0] in typed


def _is_number(word: str) -> bool:
    """True when ``float`` reads ``word`` (``inf``, ``nan`` and exponents included)."""
    try:
        float(word)
    except ValueError:
        return False
    return True


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


def _terminal_columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` says it (``COLUMNS``, else the
    terminal of stdout, else 80), without importing ``shutil`` (2-3 ms with its compressors)."""
    import os
    import sys

    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


def formatter_class() -> Any:
    """argparse's ``HelpFormatter`` given the terminal's width (:func:`_terminal_columns`):
    argparse makes a formatter for every ``add_argument`` (to check ``nargs``), and the default
    one imports ``shutil`` to ask the width, a cost the lean commands need not pay."""
    import argparse

    class Formatter(argparse.HelpFormatter):
        def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                     width: Optional[int] = None) -> None:  # fmt: skip
            width = _terminal_columns() - 2 if width is None else width
            super().__init__(prog, indent_increment, max_help_position, width)

    return Formatter


def top_parser(
    prog: str, description: str, about: Optional[Callable[[], List[str]]] = None
) -> argparse.ArgumentParser:
    """The parser of ``prog`` with the global flags both CLIs have: ``--version`` and ``-v``.

    ``--version`` prints ``<prog> <version>``, then the lines ``about()`` returns (called only
    when ``--version`` is given; what this build can do), and exits 0.
    """
    import argparse

    class Version(argparse.Action):
        def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
            super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

        def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
            import sys

            from vmr_handler import __version__

            lines = [f"{prog} {__version__}", *(about() if about is not None else [])]
            sys.stdout.write("\n".join(lines) + "\n")
            parser.exit()

    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=formatter_class())
    parser.add_argument("--version", action=Version, help="show the version and what this build can do")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def build_parser(
    parser: argparse.ArgumentParser, table: Dict[str, Command], only: Optional[str]
) -> argparse.ArgumentParser:
    """``parser`` (the global flags already added) with the sub-commands of ``table``.

    ``only`` names the command being run: its parser alone is made, with its arguments, so
    only its module is imported and argparse builds one sub-parser, not one per command (its
    help, usage and errors are the same). ``None`` (no command named: the help lists every
    command with its summary) or :data:`ALL` (completion, tests) registers every command, in
    the table's order, with the arguments of all of them only for :data:`ALL`.
    """
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in table.items():
        if only in (None, ALL, name):
            p = sub.add_parser(name, help=command.summary, formatter_class=parser.formatter_class)
            if only in (ALL, name):
                resolve(command.arguments)(p)
    return parser
