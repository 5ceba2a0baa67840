"""The roster of a deployment: which node's key may serve which client, and the signatures that prove it.

Flower's SuperNode authentication (``--enable-supernode-auth``) decides which *nodes* may connect to the SuperLink;
it says nothing about which of lightning_fed's clients a node may answer for: a node names its clients in its own
node config. The roster binds each client id to the public key of the one node allowed to serve it (the same key
pair the node authenticates to the SuperLink with), and the server checks two signatures against it:

* **Which clients a node serves.** The server asks each new node with a fresh random challenge; the node answers
  with its clients, each signed over :func:`serves_statement` (the challenge, its node id, the client id). A claim
  that the client's roster key does not verify is refused, so a second node that names a client it holds no key for
  never gets that client's tasks.
* **Each reply.** Every task travels with a fresh random nonce; the site signs its reply over
  :func:`reply_statement` (the nonce, the client id, the SHA-256 of the reply's bytes). The server verifies it against
  the roster key of the client it sent the task to before it reads anything of the reply, so a forged reply, a reply
  for another client, and a reply replayed from another round, task or run are refused.

Keys are elliptic-curve keys on a NIST curve (P-384 from ``lightning-fed deploy-keys``), in OpenSSH format as
Flower's ``flwr supernode register`` and ``--auth-supernode-private-key`` take them; signatures are ECDSA over
SHA-384. The roster file is JSON: ``{"clients": {"0": "ecdsa-sha2-nistp384 AAAA... site-0", ...}}``.

This module imports neither torch nor Flower: a ClientApp process signs with it in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lightning_fed.utilities.extras import require_extra

try:
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
except ModuleNotFoundError:  # without the `flower` extra: one line naming it (the CLI prints it), no traceback
    require_extra("A deployment's roster", "flower", "cryptography")
    raise

#: The curves a roster key may use: NIST's, as Flower's SuperNode authentication requires.
NIST_CURVES = (ec.SECP256R1, ec.SECP384R1, ec.SECP521R1)
#: Bytes of a task's nonce and of a query's challenge.
NONCE_BYTES = 32

_SIGNATURE = ec.ECDSA(hashes.SHA384())
# What each signature is about: a signature over one kind of statement never verifies as the other.
_REPLY = b"lightning_fed reply v1\x00"
_SERVES = b"lightning_fed serves v1\x00"


def reply_statement(nonce: bytes, client_id: int, reply: bytes) -> bytes:
    """What a site signs for a reply: the task's nonce, the client it answers for and the reply's SHA-256."""
    return _REPLY + nonce + _int(client_id) + hashlib.sha256(reply).digest()


def serves_statement(challenge: bytes, node_id: int, client_id: int) -> bytes:
    """What a node signs to claim a client: the server's challenge, its own node id and the client id."""
    return _SERVES + challenge + _int(node_id) + _int(client_id)


def _int(value: int) -> bytes:
    # 16 bytes: Flower's node ids are unsigned 64-bit integers, client ids may be negative in tests.
    return int(value).to_bytes(16, "big", signed=True)


def load_private_key(path: str | Path) -> ec.EllipticCurvePrivateKey:
    """A node's private key, as ``flower-supernode --auth-supernode-private-key`` reads it (OpenSSH format).

    Raises:
        ValueError: If the file is missing or holds no elliptic-curve private key on a NIST curve.
    """
    try:
        key = serialization.load_ssh_private_key(Path(path).expanduser().read_bytes(), password=None)
    except (OSError, ValueError, UnsupportedAlgorithm) as error:
        raise ValueError(
            f"The site key {path} could not be read ({error}); name the node's OpenSSH private key, as given to"
            " --auth-supernode-private-key."
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, NIST_CURVES):
        raise ValueError(f"The site key {path} is not an elliptic-curve key on a NIST curve (P-256, P-384, P-521).")
    return key


def sign(key: ec.EllipticCurvePrivateKey, statement: bytes) -> bytes:
    """``key``'s signature of ``statement`` (ECDSA, SHA-384)."""
    return key.sign(statement, _SIGNATURE)


def public_key_line(key: ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey) -> str:
    """The OpenSSH line of a key's public half (what ``flwr supernode register`` and the roster take)."""
    public = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    return public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def parse_public_key(line: str, where: str) -> ec.EllipticCurvePublicKey:
    """The public key of an OpenSSH line (``ecdsa-sha2-nistp384 AAAA... comment``).

    Raises:
        ValueError: Naming ``where``, if the line is not an elliptic-curve public key on a NIST curve.
    """
    try:
        key = serialization.load_ssh_public_key(str(line).strip().encode())
    except (ValueError, UnsupportedAlgorithm) as error:
        raise ValueError(f"{where} is not an OpenSSH public key ({error}).") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, NIST_CURVES):
        raise ValueError(f"{where} is not an elliptic-curve public key on a NIST curve (P-256, P-384, P-521).")
    return key


@dataclass(frozen=True)
class Roster:
    """Each client id's public key: the key of the one node allowed to serve that client.

    Args:
        keys: The public key of each client id.
    """

    keys: Mapping[int, ec.EllipticCurvePublicKey]

    @classmethod
    def load(cls, path: str | Path) -> Roster:
        """The roster in the JSON file ``path`` (see the module's docstring).

        Raises:
            ValueError: In one line naming the file and the entry, if the file is missing, not such JSON, names a
                client that is not an integer >= 0, or holds a key that is not a NIST elliptic-curve public key.
        """
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"The roster {path} could not be read: {error}.") from None
        clients = data.get("clients") if isinstance(data, dict) else None
        if not isinstance(clients, dict) or not clients:
            raise ValueError(
                f'The roster {path} holds no clients: it is JSON {{"clients": {{"<client id>": "<OpenSSH public'
                ' key>", ...}}, as `lightning-fed deploy-keys` writes it.'
            )
        keys: dict[int, ec.EllipticCurvePublicKey] = {}
        for name, line in clients.items():
            if not str(name).isdigit():
                raise ValueError(f"The roster {path} names client {name!r}: client ids are integers >= 0.")
            keys[int(name)] = parse_public_key(str(line), f"The roster {path}'s key of client {name}")
        return cls(keys)

    def write(self, path: str | Path) -> Path:
        """Writes the roster as JSON to ``path`` (clients in increasing order); returns ``path``."""
        clients = {str(client): public_key_line(self.keys[client]) for client in sorted(self.keys)}
        path = Path(path)
        path.write_text(json.dumps({"clients": clients}, indent=2) + "\n")
        return path

    def verify(self, client_id: int, statement: bytes, signature: object) -> bool:
        """Whether ``signature`` is ``client_id``'s roster key's signature of ``statement`` (``False`` for a client
        the roster does not name)."""
        key = self.keys.get(client_id)
        if key is None or not isinstance(signature, bytes):
            return False
        try:
            key.verify(signature, statement, _SIGNATURE)
        except InvalidSignature:
            return False
        return True


__all__ = [
    "NONCE_BYTES",
    "Roster",
    "load_private_key",
    "parse_public_key",
    "public_key_line",
    "reply_statement",
    "serves_statement",
    "sign",
]
