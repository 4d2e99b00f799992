"""Connected mode: the agent under ``vmr-host`` over a byte channel (``docs/protocol.md``).

General layout::

    agent       ConnectedAgent, AgentConfig, run_connected: the parts put together
    link        HostLink: handshake, clock sync, acknowledged resend from the outbox
    _stamps     every event leaves on the host's clock
    resources   VM-resource files fetched from vmr-host before the schedule runs
    transfers   files and directories sent to vmr-host
    httpfetch   downloads and uploads over HTTP(S)

May import: ``agent.engine``, ``agent.state``, ``agent.machine``, ``transports``, ``core``.
"""
