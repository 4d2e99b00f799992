"""Transports: where the agent's events go and where its control input comes from.

Local mode (:mod:`.local`) writes events as JSON lines to a report file and a readable log
to stderr. The virtio-serial and MQTT transports build on the same event model.
"""
