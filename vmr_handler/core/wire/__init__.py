"""What the agent and ``vmr-host`` say to each other, whatever carries it (``docs/protocol.md``).

General layout::

    protocol      newline-framed messages, validation, clock-sync maths (pure, no I/O)
    signing       Ed25519 signatures on schedule, start_time, resume, appends and kill, with replay memory
    runs          run ids: which run of an experiment a message belongs to
    clockanswers  which clock_resp the agent takes

May import: ``core`` (errors, events, fsutil); nothing of ``transports``, ``agent`` or ``host``.
"""
