"""A FIREWHEEL model-component repository, and what its components use.

FIREWHEEL finds it through the ``firewheel.mc_repo`` entry point (``pyproject.toml``: its
``repo_path`` is this package's ``__path__``), as it finds firewheel_repo_base and the other
pip-installed repositories. Nothing here imports FIREWHEEL: the model components'
``plugin.py`` files do (they run inside ``firewheel experiment``), and hand the experiment
graph's facts to these modules (``docs/firewheel.md``, "Using vmr-handler in a FIREWHEEL
experiment")::

    export       schedules as the schedule plugin pickles them, and the VM resources they
                 name, written for ``vmr-host serve``; the schedule handed over
    wiring       the virtio-serial port of the agent as QEMU arguments of the VM
    components/  the model components (folders with a MANIFEST, not Python packages):
                 ``vmr_handler.export``

May import: ``core``; never ``agent``, ``host`` or ``transports``, and nothing of it is imported
by them (the frozen agent and vmr-host never carry it).
"""
