"""Pause Python's cyclic garbage collector around bulk work on a big schedule.

Loading a schedule or planning it makes one or more small container objects per entry
(100 000 entries: ~500 000 objects). Each allocation burst triggers collection passes that
scan every live object, cycles or not: they cost as much as the work itself (``load`` 2x,
``plan`` +180 ms). That work makes no reference cycles, so nothing is left for the collector.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the ``with`` block; re-enable it after (also on error)
    only if it was enabled before, so nested pauses and callers that disabled it are respected.

    Before re-enabling, the objects made in the block are moved to the oldest generation
    (``gc.freeze()`` then ``gc.unfreeze()``): otherwise the first allocation after the block
    runs a young collection over all of them (100 000 entries: ~25 ms, every time), the very
    pass the pause avoided. They stay collectable: the next full collection sees them.
    (vmr_handler never keeps objects frozen, so the unfreeze releases only these.)
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()
