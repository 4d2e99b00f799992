"""What the agent keeps so that a crash or a lost host loses nothing.

General layout::

    journal     the agent's progress on disk, written atomically
    outbox      reports waiting for the host's acknowledgement (at least once)
    reporthold  reports whose write failed, held in bounded memory and retried in order

May import: ``core``; nothing else of ``agent``.
"""
