"""``vmr-handler``'s commands: argparse front ends, no logic of their own.

General layout::

    commandline     the ``vmr-handler`` console script (``main``) and its command table
                    (help, completion, dispatch): run, plan, check
    control_client  ``vmr-handler status|resume``: the lean path
    _planout        ``plan --json`` at parse speed
    _localrun       ``run --local``: a schedule played with no host

May import: every other package of ``agent``, ``transports``, ``core``.
"""
