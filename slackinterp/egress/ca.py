"""The bot's own certificate authority, for the hosts whose secrets the proxy adds.

Made at first start with `cryptography` (EC P-256) in a directory only the bot may enter
(`<data dir>/ca`, mode 0700; the key 0600): kernels see neither (the data directory is hidden
from them). Each kernel gets a bundle of this CA plus the system's roots, so clients that
replace the trust store with SSL_CERT_FILE or REQUESTS_CA_BUNDLE still trust every other host.
Leaves are minted per host on demand (one shared leaf key; a signature costs ~0.2 ms), with
what strict verifiers ask for: SAN, critical BasicConstraints and KeyUsage, serverAuth, AKI.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import ssl
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 30
CACHE = 256
BUNDLE_NAME = "ca-bundle.pem"
# What a kernel's clients read to trust the bundle (requests and old pip ignore
# SSL_CERT_FILE; httpx and aiohttp ignore REQUESTS_CA_BUNDLE; Node and git have their own).
TRUST_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
)


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "slackinterp"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def system_roots() -> bytes:
    """The system's trust store as PEM (what kernels trusted before), or nothing."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and os.path.isfile(candidate):
            with contextlib.suppress(OSError):
                return Path(candidate).read_bytes()
    return b""


class BotCA:
    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        key_path, cert_path = directory / "ca.key", directory / "ca.pem"
        if key_path.exists() and cert_path.exists():
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            assert isinstance(key, ec.EllipticCurvePrivateKey)
            self.key = key
            self.cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        else:
            self.key, self.cert = self._make()
            _write(
                key_path,
                self.key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                ),
            )
            _write(cert_path, self.cert.public_bytes(serialization.Encoding.PEM), 0o644)
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)
        self.bundle = self.pem + b"\n" + system_roots()
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _make() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        name = _name("slackinterp egress CA")
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return key, cert

    def leaf(self, host: str) -> x509.Certificate:
        now = dt.datetime.now(dt.UTC)
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        return (
            x509.CertificateBuilder()
            .subject_name(_name(host[:64]))
            .issuer_name(self.cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(min(now + dt.timedelta(days=LEAF_DAYS), self.cert.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), False
            )
            .sign(self.key, hashes.SHA256())
        )

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server-side context presenting `host`'s leaf, ALPN http/1.1 only (cached)."""
        with self._lock:
            found = self._contexts.get(host)
            if found is not None:
                self._contexts.move_to_end(host)
                return found
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        chain = self.leaf(host).public_bytes(serialization.Encoding.PEM) + self.pem
        key = self._leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        # The ssl module loads keys from files only: a private, short-lived one.
        with tempfile.TemporaryDirectory(dir=self.directory) as scratch:
            chain_path, key_path = Path(scratch) / "chain.pem", Path(scratch) / "key.pem"
            _write(chain_path, chain)
            _write(key_path, key)
            context.load_cert_chain(chain_path, key_path)
        with self._lock:
            self._contexts[host] = context
            while len(self._contexts) > CACHE:
                self._contexts.popitem(last=False)
        return context

    def write_bundle(self, directory: Path, uid: int | None, gid: int | None) -> Path:
        """The kernel's trust bundle (this CA + the system roots) in its runtime directory."""
        path = directory / BUNDLE_NAME
        _write(path, self.bundle, 0o644)
        if uid is not None:
            os.chown(path, uid, gid if gid is not None else -1)
        return path


def _write(path: Path, data: bytes, mode: int = 0o600) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def trust_env(bundle_inside: str) -> dict[str, str]:
    return dict.fromkeys(TRUST_VARIABLES, bundle_inside)
