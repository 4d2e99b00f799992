"""``vmr-host schedule``: a VM's schedule as delivered, and entries appended to running VMs.

General layout::

    show  ``vmr-host schedule show VM``: the schedule, its plan and what ran
    add   ``vmr-host schedule add (VM... | --all) FILE``

May import: ``host.cli``, ``host.report``, ``host.serve``, ``host.logs``, ``core``.
"""
