"""Which ``clock_resp`` the agent takes.

Pure logic: no clock of its own, no I/O, no cryptography (the agent imports
``vmr_handler.core.wire.signing`` only when a host key is configured; the signature check is passed
in as ``verifier``).

Agent side, :class:`ClockAnswers`: the ``clock_req`` ids in flight with their ``t1``. Without a
host key a ``clock_resp`` answering a pending request is used and anything else is ignored, as
before. With a host key (``verifier`` given) a ``clock_resp`` must also be signed for this VM by
the host key, echo the request's exact ``t1``, and answer a request still waiting: a recorded
answer published again answers a request already answered (or one this agent never sent) and
is refused with :class:`~vmr_handler.core.errors.SignatureError`. That binding to a one-time
request is the freshness rule of ``clock_resp``; it has no ``signed_at`` age check because the
first clock sync is what makes the agent's clock comparable with the host's.

How far ahead the host stamps ``t3`` is host code: :mod:`vmr_handler.host.serve.session.clocklead`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, Optional, Protocol

from vmr_handler.core.errors import SignatureError
from vmr_handler.core.events import Event

__all__ = ["Authenticator", "ClockAnswers"]

_ANSWERED = True
_EXPIRED = False


class Authenticator(Protocol):
    """What checks a signature (:class:`vmr_handler.core.wire.signing.Verifier`)."""

    def authenticate(self, event: Event, vm: str) -> float:
        """Raise :class:`SignatureError` unless ``event`` is signed by the host key for ``vm``."""


class ClockAnswers:
    """The agent's clock requests in flight and the answers it accepts.

    Args:
        verifier: None without a host key; else its ``authenticate(event, vm)`` checks the
            signature of a ``clock_resp`` (:meth:`vmr_handler.core.wire.signing.Verifier.authenticate`).
        vm: this agent's VM name (what the answers must be signed for).
        refused: called with the event and the :class:`SignatureError` of every answer
            :meth:`take` refuses (the agent reports it as ``control_refused``); None: raised.
        remember: how many past request ids (answered or given up) are remembered to tell a
            late answer (ignored quietly) from a replay (refused).
    """

    def __init__(
        self,
        verifier: Optional[Authenticator] = None,
        vm: str = "",
        refused: Optional[Callable[[Event, SignatureError], None]] = None,
        remember: int = 512,
    ) -> None:
        self.verifier = verifier
        self.vm = vm
        self.refused = refused
        self.remember = remember
        self._pending: Dict[str, float] = {}  # request id -> t1 (agent local clock, seconds)
        self._past: OrderedDict[str, bool] = OrderedDict()  # id -> answered (else given up)

    @property
    def waiting(self) -> bool:
        """Whether some request is still unanswered."""
        return bool(self._pending)

    def asked(self, ident: str, t1: float) -> None:
        """A ``clock_req`` ``ident`` was sent at local time ``t1`` (seconds)."""
        self._pending[ident] = t1

    def expire(self) -> None:
        """Stop waiting for the requests in flight (the end of a burst): a later answer is
        ignored (with a key: once; a second copy is a replay)."""
        for ident in self._pending:
            self._remember(ident, _EXPIRED)
        self._pending.clear()

    def take(self, event: Event) -> Optional[float]:
        """The ``t1`` of the request a ``clock_resp`` answers when the sample is to be used,
        else None (an answer to no pending request without a key, a late one, or a refused
        one handed to ``refused``).

        Raises:
            SignatureError: (only with ``verifier``, no ``refused``) what it raises
                (unsigned, another key, bad signature, signed for another VM...);
                ``replayed: ...`` when it answers a request already answered or one this agent
                never sent; ``answers clock_req X but its t1 ...`` when the echoed ``t1`` is
                not the one sent.
        """
        if self.verifier is None:
            return self._pending.pop(str(event.data.get("answers")), None)
        try:
            return self._take_signed(event, self.verifier)
        except SignatureError as exc:
            if self.refused is None:
                raise
            self.refused(event, exc)
            return None

    def _take_signed(self, event: Event, verifier: Authenticator) -> Optional[float]:
        answers = str(event.data.get("answers"))
        verifier.authenticate(event, self.vm)
        t1 = self._pending.get(answers)
        if t1 is None:
            if self._past.get(answers) is _EXPIRED:
                self._remember(answers, _ANSWERED)  # late: too late to be used, not a replay
                return None
            why = "answered already" if answers in self._past else "never sent by this agent (run)"
            raise SignatureError(event.type, event.id, f"replayed: clock_req {answers!r} was {why}")
        echoed = event.data.get("t1")
        if not isinstance(echoed, float) or echoed != t1:
            raise SignatureError(
                event.type, event.id, f"answers clock_req {answers!r} but its t1 {echoed!r} is not {t1!r}"
            )
        del self._pending[answers]
        self._remember(answers, _ANSWERED)
        return t1

    def _remember(self, ident: str, answered: bool) -> None:
        self._past[ident] = answered
        self._past.move_to_end(ident)
        while len(self._past) > self.remember:
            self._past.popitem(last=False)
