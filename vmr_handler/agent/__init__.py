"""The guest agent: engine, executor, journal, outbox, connected agent and its CLI (``vmr-handler``)."""
