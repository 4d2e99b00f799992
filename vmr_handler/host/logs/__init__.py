"""What the host keeps on disk, and reading it back.

General layout::

    store        per-VM logs (``.jsonl``), experiment state, checkpoints
    seenids      the ids of the reports a VM's log holds, in bounded memory
    appendfiles  the readable ``<vm>.log`` files, through a bounded set of open files
    jsonlread    reading a ``<vm>.jsonl`` without writing it
    logsdir      the files found by name: the control socket, the index of the schedules
    text         guest-supplied text made safe for readable logs and terminals
    writespell   said once: a VM's log that cannot be written

May import: ``core``; nothing else of ``host``.
"""
