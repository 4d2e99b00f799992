"""The channels' waits, all on the host's :class:`~vmr_handler.core.clock.Clock`: a pause
(download pacing, a VM over its read rate) and the back-off between attempts to connect (a
channel socket in ``--connect`` mode, the broker)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable

from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

from vmr_handler.core.clock import Clock


async def pause(clock: Clock, seconds: float) -> None:
    """Wait ``seconds`` on ``clock`` (virtual seconds on a ``FakeClock``); ``seconds <= 0``:
    only give the loop one turn (so a busy reader or writer never holds it)."""
    if seconds <= 0:
        await asyncio.sleep(0)
        return
    await clock.wait(asyncio.Event(), clock.time() + seconds)


def backoff(
    clock: Clock, initial: float, maximum: float, before_sleep: Callable[[Any], None]
) -> AsyncRetrying:
    """Attempts at a connection until one does not raise ``OSError`` (``ConnectFailed``
    included), forever: after the ``n``-th failure (``n`` >= 1) ``before_sleep(retry_state)`` is
    called, then the wait is ``min(initial * 2 ** (n - 1) + U(0, initial), maximum)`` seconds on
    ``clock`` (tenacity's exponential back-off with jitter, so that many VMs or hosts do not
    retry in step). Use as ``async for attempt in backoff(...): with attempt: ...``; any other
    exception is raised at once."""
    return AsyncRetrying(
        sleep=functools.partial(pause, clock),
        wait=wait_exponential_jitter(initial=initial, max=maximum, jitter=initial),
        retry=retry_if_exception_type(OSError),
        before_sleep=before_sleep,
        reraise=True,
    )
