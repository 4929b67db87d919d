"""The deployment credentials and start scripts, without starting Flower: a server certificate the
CA signed for the SuperLink's hosts, SuperNode keys in the OpenSSH EC format Flower reads, private
keys that are never readable by others, sets that are never silently or half replaced, and start
scripts that carry any path intact or refuse it with exit 2."""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import stat
import subprocess
import uuid
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.common.config import parse_config_args
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulations.deploy.credentials as credentials_module
from fedunlearn.errors import ConfigError
from simulations.deploy.credentials import main, write_credentials

DEPLOY = Path(__file__).resolve().parents[2] / "simulations" / "deploy"
PRIVATE = {"server.key", "supernode-0", "supernode-1", "supernode-2"}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def umask():
    """Set the process umask for one test and restore it afterwards."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


def test_the_server_certificate_is_signed_by_the_ca_for_every_host_and_loopback(tmp_path):
    hosts = ["superlink.example.org", "10.0.0.5"]
    written = write_credentials(tmp_path / "creds", hosts=hosts, supernodes=2)
    ca = x509.load_pem_x509_certificate(written.ca_certificate.read_bytes())
    server = x509.load_pem_x509_certificate(written.server_certificate.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the signature or issuer is wrong
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # loopback too: the SuperLink listens there, behind the proxy
    assert names.get_values_for_type(x509.DNSName) == ["superlink.example.org", "localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.5"),
        ipaddress.ip_address("127.0.0.1"),
    ]


def test_supernode_keys_are_openssh_ec_pairs(tmp_path):
    written = write_credentials(tmp_path / "creds", hosts=["localhost"], supernodes=2)
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


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o277])
def test_private_keys_are_born_0600_in_a_0700_folder_whatever_the_umask(
    tmp_path, monkeypatch, umask, mask
):
    """Every private key file is created by one open() with O_CREAT|O_EXCL whose resulting mode is
    already 0600: there is no moment at which another user could open it."""
    real_open, born = os.open, {}

    def recording_open(path, flags, mode=0o777, *args, **kwargs):
        fd = real_open(path, flags, mode, *args, **kwargs)
        if Path(os.fsdecode(path)).name in PRIVATE and flags & os.O_CREAT:
            born[Path(os.fsdecode(path)).name] = (flags, stat.S_IMODE(os.fstat(fd).st_mode))
        return fd

    monkeypatch.setattr(os, "open", recording_open)
    umask(mask)
    written = write_credentials(tmp_path / "creds", hosts=["localhost"], supernodes=3)
    assert set(born) == PRIVATE
    for flags, created in born.values():
        assert flags & os.O_EXCL and created & 0o077 == 0
    out = written.ca_certificate.parent
    assert mode(out) == 0o700
    assert {p.name: mode(p) for p in out.iterdir()} == {
        **{name: 0o600 for name in PRIVATE},
        **{name: 0o644 for name in ["ca.crt", "server.pem"]},
        **{f"supernode-{i}.pub": 0o644 for i in range(3)},
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--supernodes", "-1"], "invalid supernodes=-1: "),
        (["--supernodes", "two"], "invalid supernodes='two': "),
        (["--hosts", ","], "invalid hosts=[]: "),
        (["--hosts", "good.example.org,bad host"], "invalid hosts='bad host': "),
        (["--hosts", "evil;rm -rf"], "invalid hosts='evil;rm -rf': "),
        (["--days", "0"], "invalid days=0: a whole number of days from 1 to 3650"),
        (["--days", "-7"], "invalid days=-7: "),
        (["--days", "1.5"], "invalid days='1.5': "),
        (["--days", "3651"], "invalid days=3651: "),
    ],
)
def test_bad_arguments_exit_2_naming_the_parameter_and_write_nothing(
    tmp_path, capsys, argv, message
):
    out = tmp_path / "creds"
    assert main([str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_one_day_set_is_valid_now_and_expires_within_a_day(tmp_path):
    written = write_credentials(tmp_path / "creds", hosts=["localhost"], supernodes=0, days=1)
    server = x509.load_pem_x509_certificate(written.server_certificate.read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    assert server.not_valid_before_utc <= now
    assert now + datetime.timedelta(hours=23) < server.not_valid_after_utc
    assert server.not_valid_after_utc <= now + datetime.timedelta(days=1)


@pytest.mark.parametrize("existing", ["earlier set", "empty folder", "file", "symlink"])
def test_an_existing_output_is_refused_and_left_untouched(tmp_path, capsys, existing):
    out = tmp_path / "creds"
    if existing == "earlier set":
        write_credentials(out, hosts=["localhost"], supernodes=1)
    elif existing == "empty folder":
        out.mkdir()
    elif existing == "file":
        out.write_text("not credentials")
    else:
        write_credentials(tmp_path / "real", hosts=["localhost"], supernodes=1)
        out.symlink_to(tmp_path / "real")
    before = contents(out) if out.is_dir() else out.read_bytes()
    assert main([str(out), "--supernodes", "2"]) == 2
    assert f"invalid out='{out}': a path that does not exist yet" in capsys.readouterr().err
    assert (contents(out) if out.is_dir() else out.read_bytes()) == before
    if existing in ("file", "symlink"):  # --force replaces a credentials folder, nothing else
        assert main([str(out), "--force"]) == 2
        assert (contents(out) if out.is_dir() else out.read_bytes()) == before


def test_force_replaces_the_whole_set_with_new_keys(tmp_path):
    out = tmp_path / "creds"
    old = write_credentials(out, hosts=["localhost"], supernodes=3)
    before = contents(out)
    assert main([str(out), "--force", "--supernodes", "1", "--hosts", "10.1.2.3"]) == 0
    after = contents(out)
    assert sorted(after) == ["ca.crt", "server.key", "server.pem", "supernode-0", "supernode-0.pub"]
    assert all(after[name] != before[name] for name in after)  # every key and certificate is new
    assert mode(out) == 0o700 and mode(old.server_key) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["creds"]  # no staging or backup folder left


def test_force_refuses_a_folder_holding_files_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "creds"
    write_credentials(out, hosts=["localhost"], supernodes=1)
    (out / "notes.txt").write_text("the operator's own file")
    before = contents(out)
    assert main([str(out), "--force"]) == 2
    assert "['notes.txt']" in capsys.readouterr().err
    assert contents(out) == before


@pytest.mark.parametrize("force", [False, True])
def test_a_failure_midway_leaves_the_earlier_state_exactly(tmp_path, monkeypatch, capsys, force):
    out = tmp_path / "creds"
    if force:
        write_credentials(out, hosts=["localhost"], supernodes=3)
    before = contents(out) if force else None
    real, calls = credentials_module.write_supernode_key, []

    def fail_on_the_second_key(path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(path)

    monkeypatch.setattr(credentials_module, "write_supernode_key", fail_on_the_second_key)
    argv = [str(out), "--supernodes", "3", *(["--force"] if force else [])]
    assert main(argv) == 1
    assert "nothing written: [Errno 28] No space left on device" in capsys.readouterr().err
    assert len(calls) == 2  # it did fail midway, after writing part of a new set
    if force:
        assert contents(out) == before
    assert [p.name for p in tmp_path.iterdir()] == (["creds"] if force else [])


def test_a_failed_swap_puts_the_earlier_set_back(tmp_path, monkeypatch):
    out = tmp_path / "creds"
    write_credentials(out, hosts=["localhost"], supernodes=1)
    before = contents(out)
    real_rename = os.rename

    def refuse_to_move_the_new_set_in(source, target):
        if Path(source).name.startswith(".creds.new-"):
            raise OSError(5, "Input/output error")
        return real_rename(source, target)

    monkeypatch.setattr(os, "rename", refuse_to_move_the_new_set_in)
    with pytest.raises(OSError, match="Input/output error"):
        write_credentials(out, hosts=["localhost"], supernodes=2, force=True)
    assert contents(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["creds"]


def test_write_credentials_refuses_what_the_command_line_refuses(tmp_path):
    with pytest.raises(ConfigError, match="invalid days=0"):
        write_credentials(tmp_path / "creds", hosts=["localhost"], supernodes=1, days=0)
    with pytest.raises(ConfigError, match="invalid supernodes=True"):
        write_credentials(tmp_path / "creds", hosts=["localhost"], supernodes=True)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ start scripts' arguments


def run_script(script: str, *arguments: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(DEPLOY / script), *arguments],
        capture_output=True,
        cwd=cwd,
        env={**os.environ, **env},
        timeout=30,
    )


@pytest.mark.deployment
@pytest.mark.parametrize(
    ("script", "arguments", "env", "message"),
    [
        ("start_superlink.sh", [], {}, "usage: start_superlink.sh CREDENTIALS_DIR"),
        ("start_superlink.sh", ["{tmp}/absent"], {}, "no credentials folder"),
        ("start_superlink.sh", ["{tmp}"], {}, "missing {tmp}/ca.crt"),
        ("start_superlink.sh", ["{creds}", "0"], {}, "invalid PUBLIC_PORT='0'"),
        ("start_superlink.sh", ["{creds}", "65536"], {}, "invalid PUBLIC_PORT='65536'"),
        ("start_superlink.sh", ["{creds}", "9092;"], {}, "invalid PUBLIC_PORT='9092;'"),
        ("start_superlink.sh", ["{creds}"], {"SUPERLINK_PORT": "x"}, "invalid SUPERLINK_PORT='x'"),
        ("start_superlink.sh", ["{creds}", "9092"], {"SUPERLINK_PORT": "9092"}, "a port other than"),
        ("start_superlink.sh", ["{creds}"], {"PUBLIC_HOST": "a b"}, "invalid PUBLIC_HOST='a b'"),
        ("start_superlink.sh", ["{creds}"], {"PUBLIC_HOST": "x;}}"}, "invalid PUBLIC_HOST='x;}}'"),
        ("start_superlink.sh", ["{creds}"], {"SUPERLINK_HOST": "0.0.0.0"}, "invalid SUPERLINK_HOST="),
        ("start_superlink.sh", ["{creds}"], {"NGINX": "{tmp}/no-nginx"}, "apt-get install nginx"),
        ("start_supernode.sh", ["h:9092"], {}, "usage: start_supernode.sh SUPERLINK_HOST:PORT"),
        ("start_supernode.sh", ["h", "{file}", "{file}", "0", "2"], {}, "invalid SUPERLINK_HOST:PORT="),
        ("start_supernode.sh", ["h:9092", "{tmp}/no.crt", "{tmp}/k", "0", "2"], {}, "invalid CA_CERT="),
        ("start_supernode.sh", ["h:9092", "{file}", "{tmp}/k", "0", "2"], {}, "invalid PRIVATE_KEY="),
        ("start_supernode.sh", ["h:9092", "{file}", "{file}", "2", "2"], {}, "PARTITION_ID='2'"),
        ("start_supernode.sh", ["h:9092", "{file}", "{file}", "0", "x"], {}, "NUM_PARTITIONS='x'"),
        ("start_supernode.sh", ["h:9092", "{file}", "{file}", "0", "2", "{tmp}/x"], {}, "DATA_ROOT="),
        ("start_supernode.sh", ["h:9092", "{file}", "{file}", "0", "2"], {"SUPERNODE_PORT": "-1"}, "SUPERNODE_PORT="),
    ],
)  # fmt: skip
def test_start_scripts_refuse_bad_arguments_with_exit_2_before_starting(
    tmp_path, script, arguments, env, message
):
    file, creds = tmp_path / "f.pem", tmp_path / "creds"
    file.write_text("x")
    creds.mkdir()
    for name in ["ca.crt", "server.pem", "server.key"]:
        (creds / name).write_text("x")
    fill = {"tmp": str(tmp_path), "file": str(file), "creds": str(creds)}
    result = run_script(
        script,
        *(a.format(**fill) for a in arguments),
        cwd=tmp_path,
        **{key: value.format(**fill) for key, value in env.items()},
    )
    assert result.returncode == 2, result.stderr
    assert message.format(**fill) in result.stderr.decode()


# ------------------------------------------------- a data root reaches the SuperNode as it is


@pytest.fixture
def fake_supernode(tmp_path):
    """A ``flower-supernode`` on PATH that only records its arguments; returns a function that runs
    start_supernode.sh with a data root and returns the arguments the SuperNode would have got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = '#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$ARGV_OUT"\n'
    (bin_dir / "flower-supernode").write_text(record)
    (bin_dir / "flower-supernode").chmod(0o755)
    (tmp_path / "-ca.crt").write_text("x")  # a name that looks like an option
    (tmp_path / "key").write_text("x")

    def start(data_root: Path | bytes) -> tuple[int, list[str], str]:
        record = tmp_path / f"argv-{uuid.uuid4().hex}"
        result = subprocess.run(
            [b"bash", os.fsencode(DEPLOY / "start_supernode.sh"), b"127.0.0.2:9092", b"-ca.crt",
             b"key", b"1", b"3", os.fsencode(data_root)],
            capture_output=True, cwd=tmp_path, timeout=30,
            env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                 "ARGV_OUT": str(record)},
        )  # fmt: skip
        argv = record.read_bytes().decode().split("\0")[:-1] if record.exists() else []
        return result.returncode, argv, result.stderr.decode(errors="replace")

    return start


def node_config(argv: list[str]) -> dict:
    """What Flower's SuperNode makes of its --node-config (flwr.common.config)."""
    return parse_config_args([argv[argv.index("--node-config") + 1]])


NASTY = [
    'with "double" quotes',
    "with 'single' quotes",
    "with spaces and  two",
    "$(id) and `id` and a lone $ and $-",
    "back\\slash and trailing\\",
    '\\"escaped quote',
    "\\u0022 spelled out",
    "key=value other=1",
    "-starts-with-dash",
    "ends.toml",
    "ünïcödé ✓ 数据",
    "a \"' $ \\ mix",
]


@pytest.mark.deployment
@pytest.mark.parametrize("name", NASTY)
def test_a_data_root_with_any_characters_reaches_the_supernode_intact(
    tmp_path, fake_supernode, name
):
    data_root = tmp_path / "machine" / name
    data_root.mkdir(parents=True)
    status, argv, stderr = fake_supernode(data_root)
    assert status == 0, stderr
    expected = {"partition-id": 1, "num-partitions": 3, "data-root": str(data_root)}
    assert node_config(argv) == expected
    ca = argv[argv.index("--root-certificates") + 1]
    assert ca == str(tmp_path / "-ca.crt")  # made absolute: never mistaken for an option


# What os.path.expandvars (which the ClientApp applies to data-root) would replace.
EXPANDED = re.compile(r"\$(\w|\{[^}]*\})", re.ASCII)


@pytest.mark.deployment
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.text(
        st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/"),
        min_size=1,
        max_size=30,
    ).filter(lambda s: s not in (".", ".."))
)
def test_any_printable_folder_name_reaches_the_clientapp_intact_or_is_refused(
    tmp_path, fake_supernode, name
):
    data_root = tmp_path / uuid.uuid4().hex / name
    data_root.mkdir(parents=True)
    status, argv, stderr = fake_supernode(data_root)
    if EXPANDED.search(str(data_root)):
        assert status == 2 and "invalid DATA_ROOT=" in stderr and argv == []
    else:
        assert status == 0, stderr
        assert node_config(argv)["data-root"] == str(data_root)
        assert os.path.expandvars(str(data_root)) == str(data_root)


@pytest.mark.deployment
@pytest.mark.parametrize("name", ["$HOME", "a${PATH}b", "x$1", "${}"])
def test_a_data_root_the_clientapp_would_expand_is_refused_with_exit_2(
    tmp_path, fake_supernode, name
):
    (tmp_path / name).mkdir()
    status, argv, stderr = fake_supernode(tmp_path / name)
    assert status == 2 and argv == []
    assert "invalid DATA_ROOT=" in stderr and "no $NAME or ${...}" in stderr


@pytest.mark.deployment
@pytest.mark.parametrize("name", [b"new\nline", b"tab\there", b"escape\x1b[31m", b"latin1-\xe9"])
def test_a_data_root_flower_cannot_carry_is_refused_with_exit_2(tmp_path, fake_supernode, name):
    data_root = os.path.join(os.fsencode(tmp_path), name)
    os.mkdir(data_root)
    status, argv, stderr = fake_supernode(data_root)
    assert status == 2 and argv == []  # the SuperNode never started
    assert "invalid DATA_ROOT=" in stderr
    assert "UTF-8 text without control characters" in stderr
