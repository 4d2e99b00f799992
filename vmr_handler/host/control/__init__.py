"""The control commands of a running ``vmr-host serve``, each declared once (like the QEMU guest
agent's schema): what the control socket ``<logs>/vmr-host.sock`` dispatches, what the CLI
parses, what the console serves over REST and what its OpenAPI document says are all derived
from :data:`vmr_handler.host.control.commands.COMMANDS`.

General layout::

    commands    the declarations (name, typed request fields with defaults and help, the
                answer's fields, the refusals as VmrError classes, the console's route) and
                what is derived from them: request validation, CLI arguments, JSON schemas

Why a package of its own, at the bottom of ``host``: every surface of a command reads it (the
lean CLI path of ``vmr-host resume``, ``serve/control_api.py``, the console), so it must import
nothing they do not already pay for: only the standard library and ``core.errors``. It knows no
handler: ``serve/control_api.py`` has one method per declared command.

May import: ``core`` (the error tree), the standard library. Imported by ``cli``, ``console``
and ``serve``; never imports them.
"""
