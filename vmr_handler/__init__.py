"""vmr-handler: the agent that plays one VM's part of an emulation-testbed experiment.

See ``SPEC.md`` (shared) and ``docs/`` for the schedule semantics, the events the agent
reports and the command line. The package is layered so that the pure parts never do I/O:

* :mod:`vmr_handler.core.schedule` -- model, restricted unpickler, loaders, validation
* :mod:`vmr_handler.core.timeline` -- pure pause/break/RESUME arithmetic (the *plan*)
* :mod:`vmr_handler.agent.engine` -- drives a plan on a clock (stages, barrier, firing)
* :mod:`vmr_handler.agent.executor` -- working dirs, data drops, process trees, output
* :mod:`vmr_handler.agent.journal` -- atomic on-disk progress
* :mod:`vmr_handler.core.events` -- the one event model every report uses
* :mod:`vmr_handler.transports` -- where events go (local JSONL now)
* :mod:`vmr_handler.agent.cli` -- argparse front end only
"""

__version__ = "0.1.0"
