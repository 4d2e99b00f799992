"""What the host knows of the experiment, apart from its connections: the one model of each
VM's state, folded from its reports by the serving host, ``status`` from the logs, the report
and the console alike, and the words every view says it with.

General layout::

    vmstate    what the host knows of one VM: its reports folded by a type table
    stateword  the one state word of a VM (lost included) and what a failed entry is
    where      where a VM is, in words: one text for status, its JSON and the console's rows

May import: ``host.logs``, ``core``.
"""
