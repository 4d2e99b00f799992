"""The machine the agent runs on: processes, its own frozen run time, its KPIs.

General layout::

    executor  working directories, data drops, exec paths, process trees and output
    bundle    the frozen agent's run time: its bootloader parent, its unpack directory
    features  what this build can do: signature checks built in or left out (refused with a key)
    kpi       the VM's key performance indicators, sampled at an interval

May import: ``core``; nothing else of ``agent``.
"""
