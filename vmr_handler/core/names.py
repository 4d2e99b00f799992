"""The one rule for names: VMs, experiments, hosts and MQTT users (pure, no imports to speak of).

A name is a topic level (``vmr/<experiment>/<vm>/...``) and part of file names
(``<vm>.sock``, ``<vm>.jsonl``, ``vms/<vm>.yaml``), so it stays plain. Used by
``vmr-host serve`` (schedule file names), ``vmr-host mqtt-config`` and both MQTT sides.
"""

from __future__ import annotations

import re
from typing import Optional

#: A VM name is a topic level and a file name (``<vm>.sock``, ``<vm>.jsonl``): keep it plain.
#: The one rule for VM, experiment, host and MQTT user names (``vmr-host serve``,
#: ``vmr-host mqtt-config``, the agent).
VM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def name_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot be a VM, experiment or MQTT user name, or None when it can.

    A name is one topic level and a file name (``<vm>.yaml``, ``<vm>.jsonl``): no MQTT
    wildcards or separators, no whitespace, no leading ``_`` (reserved: ``_hosts``), and in
    the end :data:`VM_NAME` (the rule ``vmr-host serve`` applies).
    """
    if not name:
        return "is empty"
    for char, what in (("/", "'/'"), ("+", "'+'"), ("#", "'#'"), (":", "':'")):
        if char in name:
            return f"contains {what} (an MQTT topic separator, wildcard or password-file separator)"
    if any(c.isspace() for c in name):
        return "contains whitespace"
    if name.startswith("_"):
        return "starts with '_' (reserved for host topics such as _hosts)"
    if name.startswith("$"):
        return "starts with '$' (reserved by MQTT)"
    if not VM_NAME.match(name):
        return (
            "is not a usable name (letters, digits, '.', '_', '-'; starts with a letter or digit; at most 64)"
        )
    return None
