"""Credentials for a federation on Flower's Deployment Engine: a certificate authority, the
SuperLink's TLS certificate, and one EC key pair per SuperNode for ``--enable-supernode-auth``.

Usage::

    python -m simulations.deploy.credentials OUT_DIR --hosts superlink.example.org,10.0.0.5 \\
        --supernodes 3

writes ``OUT_DIR/ca.crt`` (give it to every SuperNode and to ``flwr``), ``OUT_DIR/server.pem`` and
``server.key`` (the SuperLink's), and ``OUT_DIR/supernode-<i>`` / ``supernode-<i>.pub`` (OpenSSH EC
P-384: the private key stays on SuperNode i; the public key is registered with
``flwr supernode register``). For production, use your organisation's CA instead.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Credentials:
    """Paths of the files :func:`write_credentials` wrote."""

    ca_certificate: Path
    server_certificate: Path
    server_key: Path
    supernode_keys: tuple[Path, ...]

    def public_key(self, index: int) -> Path:
        return self.supernode_keys[index].with_suffix(".pub")


def _subject_alternative_names(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _private_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def write_supernode_key(path: Path) -> Path:
    """An EC P-384 key pair in OpenSSH format (what ``flower-supernode`` and ``flwr supernode
    register`` read): ``path`` (private, mode 600) and ``path.pub``."""
    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    path.with_suffix(".pub").write_bytes(public + b"\n")
    return path


def write_credentials(
    out: Path, *, hosts: list[str], supernodes: int, days: int = 30
) -> Credentials:
    """Write a CA, a server certificate valid for ``hosts`` and ``supernodes`` key pairs."""
    if supernodes < 0:
        raise ValueError(f"invalid supernodes={supernodes}: an integer >= 0")
    if not hosts:
        raise ValueError("invalid hosts=[]: at least one host name or IP address of the SuperLink")
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days))

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedunlearn federation CA")])
    ca_certificate = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    server_certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.SubjectAlternativeName(_subject_alternative_names(hosts)), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = Credentials(
        ca_certificate=out / "ca.crt",
        server_certificate=out / "server.pem",
        server_key=out / "server.key",
        supernode_keys=tuple(out / f"supernode-{i}" for i in range(supernodes)),
    )
    paths.ca_certificate.write_bytes(ca_certificate.public_bytes(serialization.Encoding.PEM))
    paths.server_certificate.write_bytes(
        server_certificate.public_bytes(serialization.Encoding.PEM)
    )
    paths.server_key.write_bytes(_private_pem(server_key))
    paths.server_key.chmod(0o600)
    for key in paths.supernode_keys:
        write_supernode_key(key)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hosts", default="localhost,127.0.0.1", help="the SuperLink's names/IPs")
    parser.add_argument("--supernodes", type=int, default=0)
    parser.add_argument("--days", type=int, default=30)
    args = parser.parse_args(argv)
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    try:
        written = write_credentials(
            args.out, hosts=hosts, supernodes=args.supernodes, days=args.days
        )
    except ValueError as error:
        print(f"credentials: {error}", file=sys.stderr)
        return 2
    print(f"CA {written.ca_certificate}; SuperLink {written.server_certificate}")
    for key in written.supernode_keys:
        print(f"SuperNode key {key} (register {key.with_suffix('.pub')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
