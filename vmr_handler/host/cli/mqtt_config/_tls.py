"""The certificates of ``vmr-host mqtt-config --tls`` (:mod:`vmr_handler.host.cli.mqtt_config.command`):
an experiment CA, the broker's server certificate and client certificates, made with the
``cryptography`` x509 builder (EC P-256, SHA-256 signatures; imported only when used).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple

from vmr_handler.host.cli.mqtt_config.layout import is_ip


@dataclass(frozen=True)
class Pki:
    """A CA (key kept for issuing more certificates later) and the broker's certificate.

    Attributes are PEM bytes.
    """

    ca_key: bytes
    ca_cert: bytes
    server_key: bytes
    server_cert: bytes


def _names(names: Sequence[str]) -> List[Any]:
    import ipaddress

    from cryptography import x509

    out: List[Any] = []
    for name in dict.fromkeys(n.strip("[]") for n in names):
        if is_ip(name):
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        else:
            out.append(x509.DNSName(name))
    return out


def _key_usage(ca: bool) -> Any:
    """The (critical) KeyUsage of a CA: certificate and CRL signing only; else of a leaf:
    digital signatures and (EC) key agreement only."""
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not ca,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def issue(
    ca_key_pem: bytes, ca_cert_pem: bytes, common_name: str, days: int, server_names: Sequence[str] = ()
) -> Tuple[bytes, bytes]:
    """A leaf key and certificate signed by the CA (``cryptography`` x509 builder, EC P-256).

    With ``server_names``: a server certificate (SAN = those names, EKU serverAuth);
    without: a client certificate for ``common_name`` (EKU clientAuth), so a VM's client
    certificate can never pose as the broker.

    Returns:
        (key PEM, certificate PEM).
    """
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if server_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(_names(server_names)), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return _key_pem(key), cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def make_pki(experiment: str, server_names: Sequence[str], days: int) -> Pki:
    """A new CA for ``experiment`` and a server certificate for ``server_names``
    (``cryptography`` x509 builder; EC P-256, SHA-256 signatures).
    """
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"vmr {experiment} broker CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    ca_key, ca_cert = _key_pem(key), cert.public_bytes(serialization.Encoding.PEM)
    server_key, server_cert = issue(ca_key, ca_cert, "vmr broker", days, server_names)
    return Pki(ca_key, ca_cert, server_key, server_cert)
