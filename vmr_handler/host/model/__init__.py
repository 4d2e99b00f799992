"""What the host knows of the experiment, apart from its connections (room for the one
model of the experiment's state that the report and the console will share).

General layout::

    vmstate    what the host knows of one VM: its reports folded by a type table
    stateword  the one state word of a VM (lost included) and what a failed entry is

May import: ``host.logs``, ``core``.
"""
