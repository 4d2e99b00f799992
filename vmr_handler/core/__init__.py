"""What the agent and the host share: pure where it can be, no transport, no side.

General layout::

    errors        the whole error tree, drawn in its docstring
    events        the one event model; payloads: typed payloads of the events consumers read
    schedule/     frozen entries, restricted unpickler, validation, loading, lint
    timeline      pure pause/break/RESUME arithmetic: entries + RESUMEs -> Plan
    clock         the Clock protocol, SystemClock, FakeClock
    wire/         what agent and host say to each other: protocol, signing, runs, clockanswers
    control       the local control socket (status, resume) of a running agent or host
    processes     one program run and followed to its end, its process tree killed
    names         the one rule for names; readable: numbers and bytes as people read them
    fsutil        atomic writes, sha256, UTC text; ratelimit: token bucket, repeated remarks
    gcpause       the cyclic GC paused around bulk work; completion: shell completion scripts
    commandtable  one command table per CLI: help, completion and lazy dispatch

May import: the standard library and third-party libraries only; nothing of ``transports``,
``agent`` or ``host``.
"""
