"""Credentials for a federation on Flower's Deployment Engine: a certificate authority, the
SuperLink's TLS certificate, and one EC key pair per SuperNode for ``--enable-supernode-auth``.

Usage::

    python -m simulations.deploy.credentials OUT_DIR --hosts superlink.example.org,10.0.0.5 \\
        --supernodes 3 [--days 30] [--force]

writes ``OUT_DIR/ca.crt`` (give it to every SuperNode and to ``flwr``), ``OUT_DIR/server.pem`` and
``server.key`` (the SuperLink's, also used by the reverse proxy in front of it), and
``OUT_DIR/supernode-<i>`` / ``supernode-<i>.pub`` (OpenSSH EC P-384: the private key stays on
SuperNode i; the public key is registered with ``flwr supernode register``). For production, use
your organisation's CA instead.

Files are never readable by others, not even for a moment: the folder is created 0700, private
keys are created 0600 with ``O_CREAT | O_EXCL`` (whatever the umask), public files 0644 inside it.
An existing ``OUT_DIR`` is refused; ``--force`` replaces a whole earlier set (to rotate every key)
and nothing else: the new set is written to a sibling folder first and swapped in by renames, so
a failure leaves the old set as it was, never a mixture of old and new files. The server
certificate is always valid for ``localhost`` and ``127.0.0.1`` as well: the SuperLink listens on
loopback only, and the proxy and the ServerApp's SuperExec check its certificate there.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedunlearn.errors import ConfigError
from fedunlearn.store.durable_io import fsync_directory

LOOPBACK_HOSTS = ("localhost", "127.0.0.1")
MAX_DAYS = 3650
_DNS_NAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")
# The names this module writes: --force replaces a folder holding only these, so that it never
# deletes a file somebody else put there.
_OWN_FILE = re.compile(r"ca\.crt|server\.pem|server\.key|supernode-[0-9]+(\.pub)?")


@dataclass(frozen=True)
class Credentials:
    """Paths of the files :func:`write_credentials` wrote."""

    ca_certificate: Path
    server_certificate: Path
    server_key: Path
    supernode_keys: tuple[Path, ...]

    def public_key(self, index: int) -> Path:
        return self.supernode_keys[index].with_suffix(".pub")


def _subject_alternative_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*hosts, *LOOPBACK_HOSTS]):  # in order, without repeats
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _check_host(host: str) -> None:
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if len(host) > 253 or not _DNS_NAME.fullmatch(host):
        allowed = "IP addresses or DNS names (letters, digits, '-' and '.') separated by ','"
        raise ConfigError("hosts", host, allowed)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` holding ``data`` with exactly ``mode``; never a moment with a wider one.

    ``O_EXCL`` refuses an existing file (and a planted symbolic link); the file is born with at most
    ``mode`` (the umask can only narrow it) and ``fchmod`` then sets exactly ``mode``.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_supernode_key(path: Path) -> Path:
    """An EC P-384 key pair in OpenSSH format (what ``flower-supernode`` and ``flwr supernode
    register`` read): ``path`` (private, created 0600) and ``path.pub`` (0644)."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    _write_new(path, private, 0o600)
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    _write_new(path.with_suffix(".pub"), public + b"\n", 0o644)
    return path


def _certificates(hosts: Sequence[str], days: int) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, server certificate, server private key) as PEM, valid ``days`` from now."""
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
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    pem = serialization.Encoding.PEM
    return ca_certificate.public_bytes(pem), server_certificate.public_bytes(pem), key_pem


def _fill(folder: Path, hosts: Sequence[str], supernodes: int, days: int) -> None:
    """Write a whole set into the empty 0700 ``folder``."""
    ca_pem, server_pem, key_pem = _certificates(hosts, days)
    _write_new(folder / "ca.crt", ca_pem, 0o644)
    _write_new(folder / "server.pem", server_pem, 0o644)
    _write_new(folder / "server.key", key_pem, 0o600)
    for index in range(supernodes):
        write_supernode_key(folder / f"supernode-{index}")
    fsync_directory(folder)


def _check_replaceable(out: Path, force: bool) -> None:
    if not (out.exists() or out.is_symlink()):
        return
    allowed = "a path that does not exist yet, or an earlier credentials folder with --force"
    if not force or out.is_symlink() or not out.is_dir():
        raise ConfigError("out", str(out), allowed)
    foreign = sorted(p.name for p in out.iterdir() if not _OWN_FILE.fullmatch(p.name))
    if foreign:
        refusal = f"{allowed}; --force refuses to delete what it did not write: {foreign}"
        raise ConfigError("out", str(out), refusal)


def _swap_in(new: Path, out: Path) -> None:
    """Put the finished folder ``new`` at ``out``, replacing an earlier set there if any.

    Two renames in one directory: at every moment ``out`` is the old set, absent (between the
    renames), or the new set, never a mixture; if the second rename fails the old set goes back.
    """
    if not out.exists():
        os.rename(new, out)  # also refuses a non-empty folder that appeared meanwhile
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    try:
        os.rename(out, old / "set")
    except BaseException:
        os.rmdir(old)
        raise
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old / "set", out)  # should this fail too, the old set is kept in ``old``
        os.rmdir(old)
        raise
    fsync_directory(out.parent)
    shutil.rmtree(old)


def validate(hosts: Sequence[str], supernodes: int, days: int) -> None:
    """Raise :class:`ConfigError` for a parameter outside what :func:`write_credentials` takes."""
    if isinstance(supernodes, bool) or not isinstance(supernodes, int) or supernodes < 0:
        raise ConfigError("supernodes", supernodes, "a whole number >= 0")
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise ConfigError(
            "days", days, f"a whole number of days from 1 to {MAX_DAYS} (how long the set is valid)"
        )
    if not hosts:
        allowed = "at least one host name or IP address of the SuperLink"
        raise ConfigError("hosts", list(hosts), allowed)
    for host in hosts:
        _check_host(host)


def write_credentials(
    out: Path, *, hosts: Sequence[str], supernodes: int, days: int = 30, force: bool = False
) -> Credentials:
    """Write a CA, a server certificate valid for ``hosts`` (and loopback) and ``supernodes`` key
    pairs into the new folder ``out`` (mode 0700), or replace an earlier set there if ``force``.

    Raises :class:`ConfigError` (nothing written) for a bad parameter or an existing ``out``.
    """
    out = Path(out)
    validate(hosts, supernodes, days)
    _check_replaceable(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    try:
        new.chmod(0o700)  # mkdtemp's 0700 may have been narrowed by the umask
        _fill(new, hosts, supernodes, days)
        _swap_in(new, out)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    return Credentials(
        ca_certificate=out / "ca.crt",
        server_certificate=out / "server.pem",
        server_key=out / "server.key",
        supernode_keys=tuple(out / f"supernode-{i}" for i in range(supernodes)),
    )


def _whole_number(parameter: str, text: str, allowed: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", text.strip()):
        raise ConfigError(parameter, text, allowed)
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hosts", default="localhost,127.0.0.1", help="the SuperLink's names/IPs")
    parser.add_argument("--supernodes", default="0", help="how many SuperNode key pairs")
    parser.add_argument("--days", default="30", help=f"validity in days, 1 to {MAX_DAYS}")
    parser.add_argument(
        "--force", action="store_true", help="replace an earlier set in OUT (rotates every key)"
    )
    args = parser.parse_args(argv)
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    try:
        supernodes = _whole_number("supernodes", args.supernodes, "a whole number >= 0")
        days = _whole_number("days", args.days, f"a whole number of days from 1 to {MAX_DAYS}")
        written = write_credentials(
            args.out, hosts=hosts, supernodes=supernodes, days=days, force=args.force
        )
    except ConfigError as error:
        print(f"credentials: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"credentials: nothing written: {error}", file=sys.stderr)
        return 1
    print(f"CA {written.ca_certificate}; SuperLink {written.server_certificate}")
    for key in written.supernode_keys:
        print(f"SuperNode key {key} (register {key.with_suffix('.pub')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
