"""``vmr-host``: the host controller (SPEC section 8, issue 4).

One process serves every VM of an experiment over its virtio-serial channel (a QEMU
chardev unix socket), on one asyncio event loop. Modules, one per role:

* :mod:`.barrier` -- the experiment start barrier (pure: plain numbers, no I/O)
* :mod:`.store` -- per-VM logs (``.log``/``.jsonl``, de-duplicated), ``experiment.json``,
  confined transfers
* :mod:`.resources` -- the VM-resource store (``--resources``), confined and hashed
* :mod:`.session` -- one VM's protocol engine (handshake, clock, acks, limits)
* :mod:`.server` -- the event loop: listen/connect wirings, control socket, experiment
* :mod:`.config` -- settings and per-VM limits
* :mod:`.cli` -- ``vmr-host serve|status|resume|release``

The wire protocol is ``docs/protocol.md``; the operator guide is ``docs/host.md``.
"""
