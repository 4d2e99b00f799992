"""The MQTT flags of ``vmr-host serve`` (``docs/mqtt.md``): the "MQTT transport" group and the
:class:`~vmr_handler.transports.mqtt.options.MqttOptions` they give, with ``--credentials``.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict

from vmr_handler.core.errors import UsageError


def add_serve_mqtt(serve: argparse.ArgumentParser) -> None:
    """The ``serve`` group "MQTT transport": broker, credentials, several hosts on one broker."""
    mq = serve.add_argument_group("MQTT transport (docs/mqtt.md)")
    mq.add_argument(
        "--transport",
        choices=["virtio-serial", "mqtt"],
        default="virtio-serial",
        help="how VMs are reached (default virtio-serial channel sockets)",
    )
    mq.add_argument("--broker", metavar="URL", help="mqtt://HOST:PORT or mqtts://HOST:PORT")
    mq.add_argument("--experiment", metavar="NAME", help="experiment name (topic vmr/NAME/...)")
    mq.add_argument(
        "--credentials",
        metavar="FILE",
        help="YAML with broker, experiment, username, password, ca_file|ca_pem, cert_file, key_file "
        "(as written by `vmr-host mqtt-config`); flags win",
    )
    mq.add_argument("--username", metavar="NAME", help="broker username of this host")
    mq.add_argument("--password-file", metavar="FILE", help="file holding the broker password")
    mq.add_argument("--ca-file", metavar="FILE", help="CA certificate of the broker (mqtts)")
    mq.add_argument("--cert-file", metavar="FILE", help="client certificate (mqtts, when required)")
    mq.add_argument("--key-file", metavar="FILE", help="client key (mqtts, when required)")
    mq.add_argument(
        "--host-id", metavar="NAME", help="this host among hosts sharing a broker (default hostname)"
    )
    role = mq.add_mutually_exclusive_group()
    role.add_argument(
        "--coordinator",
        action="store_true",
        help="several hosts share the broker and this one decides the start for all (with --peers)",
    )
    role.add_argument(
        "--member",
        action="store_true",
        help="several hosts share the broker: announce this host's VMs, take the coordinator's start",
    )
    mq.add_argument(
        "--peers",
        action="append",
        default=[],
        metavar="HOST,...",
        help="(coordinator) the other hosts' --host-id: the start waits for each one's VMs",
    )


def mqtt_options(args: argparse.Namespace) -> Any:
    """:class:`~vmr_handler.transports.mqtt.options.MqttOptions` from ``--credentials`` and flags.

    Raises:
        UsageError: unreadable credentials file, or options the MQTT transport cannot use.
    """
    import yaml

    from vmr_handler.core.errors import MqttError
    from vmr_handler.transports.mqtt.options import options_from

    settings: Dict[str, Any] = {}
    source = "command line"
    if args.credentials:
        source = args.credentials
        try:
            with open(args.credentials, encoding="utf-8") as fh:
                doc = yaml.safe_load(fh) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"cannot read --credentials {args.credentials}: {exc}") from exc
        if not isinstance(doc, dict):
            raise UsageError(f"--credentials {args.credentials}: must be a YAML mapping")
        settings.update(doc)
    for key in ("broker", "experiment", "username", "password_file", "ca_file", "cert_file", "key_file"):
        if getattr(args, key, None):
            settings[key] = getattr(args, key)
            if key == "password_file":
                settings.pop("password", None)
    try:
        return options_from(settings, source)
    except MqttError as exc:
        raise UsageError(str(exc)) from exc
