"""One VM's side of the protocol on the host: handshake, clock, acks, limits.

General layout::

    session     VmSession: the connection state and its reports
    api         the interfaces a session works through (Link, HostApi, HostEvents)
    intake      files a VM sends out through its session, within a hashing budget
    checkpoint  a session's restart checkpoint (what its log replay gave), ToldHost
    clocklead   how far ahead the host stamps a clock_resp's t3
    _delivery   schedules and resources streamed to the agent
    _status     what ``vmr-host status`` shows of one VM

May import: ``host.serve.files``, ``host.serve.config``, ``host.model``, ``host.logs``, ``core``.
"""
