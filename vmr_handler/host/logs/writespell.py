"""Said once: a VM's log that cannot be written (a full disk on the host)."""

from __future__ import annotations

import logging

log = logging.getLogger("vmr_handler.host")


class WriteSpell:
    """Says once when a VM's log cannot be written (a full disk, EIO) and once when it can
    again, however many reports fail meanwhile (the agent resends every 10 s).

    Args:
        name: the VM's name.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        #: the last write failed
        self.failing = False

    def failed(self, exc: OSError) -> None:
        """A write of the VM's log failed with ``exc`` (nothing of it was recorded)."""
        if not self.failing:
            log.error(
                "%s: cannot write the log (%s): its reports stay unacknowledged on the VM "
                "until the host's logs dir has room again (nothing is lost)",
                self.name,
                exc.strerror or exc,
            )
        self.failing = True

    def ok(self) -> None:
        """A write of the VM's log succeeded."""
        if self.failing:
            self.failing = False
            log.warning("%s: log written again: the reports it resends are stored", self.name)
