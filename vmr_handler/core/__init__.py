"""Shared code of the guest agent and the host.

Errors, events, protocol, clock, timeline, schedule, signing, names, file helpers: nothing here
imports from ``transports``, ``agent`` or ``host``.
"""
