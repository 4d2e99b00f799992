"""The experiment a ``vmr-host serve`` runs, over all its VMs.

General layout::

    experiment   Experiment: start time, RESUMEs, peer hosts, signing, watchers
    barrier      the start barrier (pure: plain numbers, no I/O)
    appendbook   batches of entries the operator appended to running VMs
    killbook     the kills the operator issued (vmr-host kill), sent until answered
    hostentries  on_host entries, run on the host when a VM's agent asks
    onhost       what an on_host entry runs: its argv and its FIREWHEEL_* environment

May import: ``host.serve.session``, ``host.serve.files``, ``host.serve.config``,
``host.logs``, ``core``.
"""
