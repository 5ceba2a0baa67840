"""``lightning-fed deploy-keys`` and the roster: the CA, the SuperLink's certificate (its chain and names, tried with a
real TLS handshake), the sites' key pairs, and the signatures the roster checks."""

from __future__ import annotations

import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest

pytest.importorskip("cryptography", reason="the `flower` extra installs cryptography")

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from lightning_fed.deploy.keys import main, write_authority, write_keys
from lightning_fed.deploy.roster import (
    Roster,
    load_private_key,
    reply_statement,
    serves_statement,
    sign,
)


def test_the_command_writes_a_ca_the_superlink_certificate_each_site_key_and_the_roster(tmp_path, capsys):
    out = tmp_path / "keys"
    assert main(["--out", str(out), "--site", "0,1", "--site", "2", "--host", "fl.example.org"]) == 0
    assert "register each site-i.pub" in capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "ca.key",
        "ca.pem",
        "roster.json",
        "site-0.key",
        "site-0.pub",
        "site-1.key",
        "site-1.pub",
        "superlink.key",
        "superlink.pem",
    ]
    for private in ("ca.key", "superlink.key", "site-0.key", "site-1.key"):
        assert stat.S_IMODE((out / private).stat().st_mode) == 0o600, private
    ca = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
    server = x509.load_pem_x509_certificate((out / "superlink.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names_of = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names_of.get_values_for_type(x509.DNSName) == ["localhost", "fl.example.org"]
    assert [str(ip) for ip in names_of.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    # The roster names each client with its site's public key; site 0 serves clients 0 and 1.
    roster = Roster.load(out / "roster.json")
    site_0, site_1 = load_private_key(out / "site-0.key"), load_private_key(out / "site-1.key")
    assert roster.keys[0] == roster.keys[1] == site_0.public_key() and roster.keys[2] == site_1.public_key()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--site", "0,1", "--site", "1"], "Client 1 is given to sites 0 and 1"),
        (["--site", "0,x"], "--site takes client ids separated by commas"),
        (["--sites", "0"], "--sites must be >= 1"),
        (["--sites", "2", "--days", "0"], "--days must be >= 1"),
    ],
)
def test_bad_input_is_refused_in_one_line(tmp_path, capsys, argv, says):
    assert main(["--out", str(tmp_path / "keys"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lightning-fed deploy-keys: ") and says in err[0]


def test_a_used_directory_is_refused(tmp_path, capsys):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "ca.pem").write_text("keep")
    assert main(["--out", str(tmp_path / "keys"), "--sites", "1"]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert (tmp_path / "keys" / "ca.pem").read_text() == "keep"


def _handshake(keys_dir: Path, trusted_ca: Path, host: str) -> str | None:
    """A TLS handshake with a server presenting the SuperLink's certificate, from a client trusting ``trusted_ca`` and
    reaching it as ``host``: ``None`` if it succeeds, else why it failed."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(keys_dir / "superlink.pem", keys_dir / "superlink.key")
    client_context = ssl.create_default_context(cafile=str(trusted_ca))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def accept() -> None:
            connection, _ = listener.accept()
            try:
                with server_context.wrap_socket(connection, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                connection.close()

        thread = threading.Thread(target=accept)
        thread.start()
        try:
            with (
                socket.create_connection(("127.0.0.1", port)) as raw,
                client_context.wrap_socket(raw, server_hostname=host),
            ):
                return None
        except ssl.SSLCertVerificationError as error:
            return str(error.verify_message)
        finally:
            thread.join(10)


def test_the_superlink_certificate_passes_tls_for_its_names_and_only_under_its_ca(tmp_path):
    keys = write_keys(tmp_path / "keys", [[0]])
    assert _handshake(keys.directory, keys.ca, "localhost") is None
    assert _handshake(keys.directory, keys.ca, "127.0.0.1") is None
    assert "mismatch" in str(_handshake(keys.directory, keys.ca, "superlink.example.org"))
    other = write_authority(tmp_path / "other")
    assert "unable to get local issuer certificate" in str(_handshake(keys.directory, other.ca, "localhost"))


def test_signatures_verify_for_the_clients_of_the_signing_key_only(tmp_path):
    keys = write_keys(tmp_path / "keys", [[0], [1]])
    roster = Roster.load(keys.roster)
    site_0 = load_private_key(keys.site_key(0))
    nonce, reply = bytes(range(32)), b"the reply"
    signature = sign(site_0, reply_statement(nonce, 0, reply))
    assert roster.verify(0, reply_statement(nonce, 0, reply), signature)
    assert not roster.verify(1, reply_statement(nonce, 1, reply), sign(site_0, reply_statement(nonce, 1, reply)))
    assert not roster.verify(0, reply_statement(nonce, 0, b"another reply"), signature)
    assert not roster.verify(0, reply_statement(bytes(32), 0, reply), signature)  # another task's nonce
    assert not roster.verify(7, reply_statement(nonce, 7, reply), signature)  # not in the roster
    assert not roster.verify(0, reply_statement(nonce, 0, reply), "not bytes")
    # A claim to serve a client is another statement: a reply's signature never proves one.
    assert not roster.verify(0, serves_statement(nonce, 0, 0), signature)
    assert roster.verify(0, serves_statement(nonce, 5, 0), sign(site_0, serves_statement(nonce, 5, 0)))


def test_a_bad_roster_or_site_key_is_refused_in_one_line(tmp_path):
    keys = write_keys(tmp_path / "keys", [[0]])
    line = keys.site_public_key(0).read_text().strip()
    cases = {
        "missing.json": None,
        "empty.json": "{}",
        "name.json": f'{{"clients": {{"zero": "{line}"}}}}',
        "key.json": '{"clients": {"0": "ssh-rsa AAAA"}}',
    }
    says = ["could not be read", "holds no clients", "client ids are integers", "is not an OpenSSH public key"]
    for (name, text), expected in zip(cases.items(), says):
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=expected) as error:
            Roster.load(tmp_path / name)
        assert "\n" not in str(error.value)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp_path / "rsa.key").write_bytes(rsa_key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
    with pytest.raises(ValueError, match="not an elliptic-curve key on a NIST curve"):
        load_private_key(tmp_path / "rsa.key")
