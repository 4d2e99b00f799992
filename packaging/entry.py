"""PyInstaller entry script for the frozen guest agent (``dist/vmr-handler``).

It lives outside the package on purpose: a script inside ``vmr_handler/`` would put that
directory on the bundle's module path and make its modules importable as top-level names.

First thing, :func:`vmr_handler.agent.machine.bundle.startup` ties the agent's life to its
bootloader parent and removes the unpacked copies that killed instances left behind
(single-file build only; nothing for onedir).
"""

from vmr_handler.agent.machine.bundle import startup

startup()

from vmr_handler.agent.cli.commandline import main  # noqa: E402 (after startup: nothing runs before it)

if __name__ == "__main__":
    raise SystemExit(main())
