"""PyInstaller entry script for the frozen guest agent (``dist/vmr-handler``).

It lives outside the package on purpose: a script inside ``vmr_handler/`` would put that
directory on the bundle's module path and make its modules importable as top-level names.
"""

from vmr_handler.agent.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
