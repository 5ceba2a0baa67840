"""``lightning-fed deploy-keys``: the keys of a secure deployment, for a trial or a first federation.

Example::

    lightning-fed deploy-keys --out keys --sites 3

writes into ``keys/``:

* ``ca.pem``, ``ca.key``: a certificate authority of this deployment (keep ``ca.key`` away from the SuperLink; it
  only signs certificates). Every SuperNode and ``flwr`` trust ``ca.pem`` (``--root-certificates``, the connection's
  ``root-certificates``).
* ``superlink.pem``, ``superlink.key``: the SuperLink's TLS certificate, signed by the CA, valid for ``localhost``,
  ``127.0.0.1`` and every ``--host`` given (``--ssl-certfile``, ``--ssl-keyfile``, ``--ssl-ca-certfile ca.pem``).
* ``site-<i>.key``, ``site-<i>.pub``: site ``i``'s key pair (P-384, OpenSSH format): the private key authenticates
  its SuperNode (``--auth-supernode-private-key``) and signs its replies (node config ``site-key``); the public key
  is registered with the SuperLink (``flwr supernode register``) and stands in the roster.
* ``roster.json``: each client id's public key (:class:`~lightning_fed.deploy.roster.Roster`); ``lightning-fed
  flower-app --roster keys/roster.json`` puts it into the app.

Site ``i`` serves client ``i`` (``--sites N``), or the clients ``--site`` lists (``--site 0,1 --site 2``: site 0 serves
clients 0 and 1, site 1 client 2). In a real federation each site makes its own key pair and sends only the public
half (``ssh-keygen -t ecdsa -b 384 -f site.key``); the roster is then written by hand from those lines.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_fed.utilities.extras import require_extra

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ModuleNotFoundError:  # without the `flower` extra: one line naming it (the CLI prints it), no traceback
    require_extra("`lightning-fed deploy-keys`", "flower", "cryptography")
    raise

from lightning_fed.deploy.roster import Roster, public_key_line

PROGRAM = "lightning-fed deploy-keys"
#: The names every SuperLink certificate is valid for: a SuperLink on this machine.
LOCAL_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class DeploymentKeys:
    """Where :func:`write_keys` put a deployment's keys.

    Attributes:
        directory: The directory that holds them.
        sites: The clients of each site, by site index.
    """

    directory: Path
    sites: tuple[tuple[int, ...], ...]

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def superlink_certificate(self) -> Path:
        return self.directory / "superlink.pem"

    @property
    def superlink_key(self) -> Path:
        return self.directory / "superlink.key"

    @property
    def roster(self) -> Path:
        return self.directory / "roster.json"

    def site_key(self, site: int) -> Path:
        """Site ``site``'s private key."""
        return self.directory / f"site-{site}.key"

    def site_public_key(self, site: int) -> Path:
        """Site ``site``'s public key."""
        return self.directory / f"site-{site}.pub"


def write_keys(
    out: str | Path,
    sites: Sequence[Sequence[int]],
    hosts: Sequence[str] = (),
    days: int = 365,
) -> DeploymentKeys:
    """Writes a CA, the SuperLink's certificate, each site's key pair and the roster into ``out``.

    Args:
        out: The directory (created; must be empty if it exists).
        sites: The clients each site serves, by site index.
        hosts: Names and addresses the SuperLink's certificate is valid for, besides :data:`LOCAL_HOSTS`.
        days: How long the certificates are valid.

    Raises:
        FileExistsError: If ``out`` exists and is not an empty directory.
        ValueError: If a client is given to two sites, a site serves none, or ``days`` < 1.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {out} exists and is not an empty directory; name a new one.")
    owners: dict[int, int] = {}
    for site, clients in enumerate(sites):
        if not clients:
            raise ValueError(f"Site {site} serves no client: give each --site at least one client id.")
        for client in clients:
            if client < 0:
                raise ValueError(f"Client ids are integers >= 0; site {site} names {client}.")
            if client in owners:
                raise ValueError(f"Client {client} is given to sites {owners[client]} and {site}: one site per client.")
            owners[client] = site
    keys = write_authority(out, hosts, days)
    keys = DeploymentKeys(keys.directory, tuple(tuple(int(c) for c in clients) for clients in sites))
    roster: dict[int, ec.EllipticCurvePublicKey] = {}
    for site, clients in enumerate(keys.sites):
        roster.update(dict.fromkeys(clients, write_site_key(keys, site)))
    Roster(roster).write(keys.roster)
    return keys


def write_authority(out: str | Path, hosts: Sequence[str] = (), days: int = 365) -> DeploymentKeys:
    """Writes a new CA (``ca.pem``, ``ca.key``) and the SuperLink's certificate it signs (``superlink.pem``,
    ``superlink.key``, valid for :data:`LOCAL_HOSTS` and ``hosts``) into ``out``; no site yet.

    Raises:
        ValueError: If ``days`` < 1.
    """
    if days < 1:
        raise ValueError(f"--days must be >= 1; got {days}.")
    keys = DeploymentKeys(Path(out), ())
    keys.directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    validity = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days))

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lightning_fed deployment CA")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    _write_private(keys.directory / "ca.key", _pem(ca_key))
    keys.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    server_key = ec.generate_private_key(ec.SECP384R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*LOCAL_HOSTS, *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lightning_fed SuperLink")])
    server = (
        _builder(server_name, ca_name, server_key.public_key(), validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    _write_private(keys.superlink_key, _pem(server_key))
    keys.superlink_certificate.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    return keys


def write_site_key(keys: DeploymentKeys, site: int) -> ec.EllipticCurvePublicKey:
    """Writes site ``site``'s new key pair (P-384, OpenSSH format: ``site-<site>.key`` readable by its owner only,
    ``site-<site>.pub``); returns the public key."""
    site_key = ec.generate_private_key(ec.SECP384R1())
    _write_private(
        keys.site_key(site),
        site_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    keys.site_public_key(site).write_text(f"{public_key_line(site_key)} site-{site}\n")
    return site_key.public_key()


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    validity: tuple[datetime.datetime, datetime.datetime],
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
    )


def _usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not cert_sign,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_private(path: Path, data: bytes) -> None:
    """Writes a private key readable by its owner only."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as stream:
        stream.write(data)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="The directory to write (created; must be empty if it exists).")
    sites = parser.add_mutually_exclusive_group(required=True)
    sites.add_argument("--sites", type=int, help="How many sites; site i serves client i.")
    sites.add_argument(
        "--site",
        action="append",
        help="The clients one site serves, comma-separated (repeat it for each site, in order).",
    )
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        help="A name or address the SuperLink is reached at, besides localhost and 127.0.0.1 (repeat it).",
    )
    parser.add_argument("--days", type=int, default=365, help="How long the certificates are valid (default 365).")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command: 0 once the keys are written, 2 with one line on stderr for a bad input."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.sites is not None:
            if args.sites < 1:
                raise ValueError(f"--sites must be >= 1; got {args.sites}.")
            sites: list[list[int]] = [[site] for site in range(args.sites)]
        else:
            sites = [[int(value) for value in site.split(",") if value.strip()] for site in args.site]
        keys = write_keys(args.out, sites, hosts=args.host, days=args.days)
    except (ValueError, FileExistsError) as error:
        if isinstance(error, ValueError) and "invalid literal" in str(error):
            error = ValueError(f"--site takes client ids separated by commas (e.g. --site 0,1); got {args.site}.")
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        return 2
    print(
        f"Wrote the keys of {len(keys.sites)} sites into {keys.directory}: the SuperLink takes ca.pem, superlink.pem"
        f" and superlink.key, site i site-i.key; register each site-i.pub (`flwr supernode register`) and give"
        f" {keys.roster.name} to `lightning-fed flower-app --roster`."
    )
    return 0


__all__ = ["LOCAL_HOSTS", "DeploymentKeys", "main", "write_authority", "write_keys", "write_site_key"]


if __name__ == "__main__":
    sys.exit(main())
