"""The deployment credentials: a server certificate the CA signed for the SuperLink's hosts, and
SuperNode keys in the OpenSSH EC format Flower's SuperNode authentication reads."""

from __future__ import annotations

import ipaddress
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from simulations.deploy.credentials import main, write_credentials

DEPLOY = Path(__file__).resolve().parents[1] / "simulations" / "deploy"


def test_the_server_certificate_is_signed_by_the_ca_for_every_host(tmp_path):
    written = write_credentials(tmp_path, hosts=["localhost", "127.0.0.1"], supernodes=2)
    ca = x509.load_pem_x509_certificate(written.ca_certificate.read_bytes())
    server = x509.load_pem_x509_certificate(written.server_certificate.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the signature or issuer is wrong
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert stat.S_IMODE(written.server_key.stat().st_mode) == 0o600


def test_supernode_keys_are_openssh_ec_pairs(tmp_path):
    written = write_credentials(tmp_path, hosts=["localhost"], supernodes=2)
    assert [k.name for k in written.supernode_keys] == ["supernode-0", "supernode-1"]
    public_keys = set()
    for index, key in enumerate(written.supernode_keys):
        private = serialization.load_ssh_private_key(key.read_bytes(), password=None)
        public = serialization.load_ssh_public_key(written.public_key(index).read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert private.public_key().public_numbers() == public.public_numbers()
        assert written.public_key(index).read_text().startswith("ecdsa-sha2-nistp384 ")
        public_keys.add(written.public_key(index).read_text())
    assert len(public_keys) == 2  # one key per SuperNode


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--supernodes", "-1"], "supernodes=-1"), (["--hosts", ","], "hosts=[]")],
)
def test_bad_arguments_name_the_parameter_and_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "creds"
    assert main([str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="the start scripts are bash scripts")
@pytest.mark.parametrize(
    ("script", "arguments", "message"),
    [
        ("start_superlink.sh", [], "usage: start_superlink.sh CREDENTIALS_DIR"),
        ("start_superlink.sh", ["{tmp}/absent"], "no credentials folder"),
        ("start_superlink.sh", ["{tmp}"], "missing {tmp}/ca.crt"),
        ("start_supernode.sh", ["h:9092"], "usage: start_supernode.sh SUPERLINK_HOST:PORT"),
        ("start_supernode.sh", ["h:9092", "{tmp}/no.crt", "{tmp}/k", "0", "2"], "invalid CA_CERT="),
        ("start_supernode.sh", ["h:9092", "{file}", "{tmp}/k", "0", "2"], "invalid PRIVATE_KEY="),
        ("start_supernode.sh", ["h:9092", "{file}", "{file}", "2", "2"], "PARTITION_ID='2'"),
        ("start_supernode.sh", ["h:9092", "{file}", "{file}", "0", "x"], "NUM_PARTITIONS='x'"),
        ("start_supernode.sh", ["h:9092", "{file}", "{file}", "0", "2", "{tmp}/x"], "DATA_ROOT="),
    ],
)
def test_start_scripts_refuse_bad_arguments_with_exit_2_before_starting(
    tmp_path, script, arguments, message
):
    file = tmp_path / "f.pem"
    file.write_text("x")
    fill = {"tmp": str(tmp_path), "file": str(file)}
    result = subprocess.run(
        ["bash", str(DEPLOY / script), *(a.format(**fill) for a in arguments)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert message.format(**fill) in result.stderr
