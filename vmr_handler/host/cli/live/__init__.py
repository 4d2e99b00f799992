"""``vmr-host push|pull|exec``: change running VMs.

General layout::

    commands  the sub-commands' parsers and their dispatch
    follow    what they share: issue a generated batch, then follow it
    pull      ``vmr-host pull``; _push: ``vmr-host push``; _exec: ``vmr-host exec``

May import: ``host.cli`` (``schedule.add``), ``host.serve``, ``host.logs``, ``core``.
"""
