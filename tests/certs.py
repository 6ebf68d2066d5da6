"""A throw-away PKI for tests: certificate authorities, server and client
certificates made with :mod:`cryptography` and written as PEM files.

Keys are ECDSA P-256 (fast to make); certificates are valid from an hour ago
for ``days`` days.  Typical use::

    ca = CA.create(tmp_path, "test-ca")
    server = ca.issue("server", "localhost", server=True)      # SAN localhost, 127.0.0.1, ::1
    client = ca.issue("alice", "alice")                        # client auth, CN=alice
    other = CA.create(tmp_path, "other-ca").issue("mallory", "alice")   # not trusted by ca

    # listener: tls_cert=server.chain_path, tls_key=server.key_path, tls_ca=ca.cert_path
    # paho: tls_set(ca_certs=ca.cert_path, certfile=client.chain_path, keyfile=client.key_path)

An intermediate CA (``ca.intermediate("sub-ca")``) issues certificates whose
``chain_path`` holds the leaf and the intermediate, so a client sending it is
verified against the root alone.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CA", "Issued", "make_pki"]


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(*certs: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def _validity(builder: x509.CertificateBuilder, days: int,
              not_after: datetime.datetime | None = None) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    end = not_after or now + datetime.timedelta(days=days)
    start = min(now, end) - datetime.timedelta(hours=1)
    return builder.not_valid_before(start).not_valid_after(end)


@dataclass
class Issued:
    """A certificate and its key, written as PEM files.

    :ivar name: the file name stem (``<dir>/<name>.crt``, ``.key``,
        ``-chain.pem``).
    :ivar cert: the leaf certificate.
    :ivar key: its private key.
    :ivar chain: the leaf followed by the intermediate CAs (not the root).
    :ivar cert_path: PEM file of the leaf alone.
    :ivar key_path: PEM file of the private key (PKCS#8, unencrypted).
    :ivar chain_path: PEM file of :attr:`chain` (what a server or client
        should present).
    """

    name: str
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    chain: list[x509.Certificate]
    cert_path: Path
    key_path: Path
    chain_path: Path

    @property
    def common_name(self) -> str:
        return self.cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


@dataclass
class CA:
    """A certificate authority that issues certificates into ``directory``.

    :ivar cert_path: PEM file of this CA's certificate (the trust anchor to
        give to a client or to a listener's ``tls_ca`` when this is a root).
    :ivar parents: the CAs above this one, nearest first (empty for a root).
    """

    name: str
    directory: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_path: Path
    key_path: Path
    parents: list["CA"] = field(default_factory=list)

    @classmethod
    def create(cls, directory: Path | str, name: str = "test-ca", *,
               common_name: str | None = None, days: int = 30) -> "CA":
        """A self-signed root CA.

        :param directory: where the PEM files go (created when missing).
        :param name: file name stem, and the CN unless ``common_name`` is set.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        key = _new_key()
        subject = _name(common_name or name, "tbmq tests")
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(digital_signature=True, content_commitment=False,
                              key_encipherment=False, data_encipherment=False,
                              key_agreement=False, key_cert_sign=True, crl_sign=True,
                              encipher_only=False, decipher_only=False),
                critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
        )
        cert = _validity(builder, days).sign(key, hashes.SHA256())
        return cls._write(name, directory, cert, key, [])

    @classmethod
    def _write(cls, name, directory, cert, key, parents) -> "CA":
        cert_path = directory / f"{name}.crt"
        key_path = directory / f"{name}.key"
        cert_path.write_bytes(_cert_pem(cert))
        key_path.write_bytes(_key_pem(key))
        return cls(name, directory, cert, key, cert_path, key_path, parents)

    def _builder(self, subject: x509.Name, public_key, days: int,
                 not_after: datetime.datetime | None = None) -> x509.CertificateBuilder:
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self.key.public_key()), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key),
                           critical=False)
        )
        return _validity(builder, days, not_after)

    def intermediate(self, name: str, *, common_name: str | None = None,
                     days: int = 30) -> "CA":
        """An intermediate CA signed by this one (same directory)."""
        key = _new_key()
        builder = self._builder(_name(common_name or name, "tbmq tests"), key.public_key(), days)
        builder = builder.add_extension(
            x509.BasicConstraints(ca=True, path_length=None), critical=True
        ).add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False,
                          key_agreement=False, key_cert_sign=True, crl_sign=True,
                          encipher_only=False, decipher_only=False),
            critical=True)
        cert = builder.sign(self.key, hashes.SHA256())
        return self._write(name, self.directory, cert, key, [self] + self.parents)

    def issue(self, name: str, common_name: str, *, server: bool = False,
              dns_names: tuple[str, ...] = (), ip_addresses: tuple[str, ...] = (),
              days: int = 30, not_after: datetime.datetime | None = None) -> Issued:
        """A leaf certificate signed by this CA.

        :param name: file name stem in the CA's directory.
        :param common_name: the subject CN (what X.509 authentication matches).
        :param server: a server certificate (serverAuth; SAN ``localhost``,
            ``127.0.0.1`` and ``::1`` unless names are given) instead of a
            client certificate (clientAuth).
        :param dns_names: extra DNS subject alternative names.
        :param ip_addresses: extra IP subject alternative names.
        :param not_after: an explicit end of validity (e.g. in the past, for
            an expired certificate).
        :returns: the :class:`Issued` certificate with its files written.
        """
        key = _new_key()
        builder = self._builder(_name(common_name), key.public_key(), days, not_after)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        ).add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if server and not dns_names and not ip_addresses:
            dns_names, ip_addresses = ("localhost",), ("127.0.0.1", "::1")
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        chain = [cert] + ([self.cert] if self.parents else []) + [
            p.cert for p in self.parents[:-1]]
        cert_path = self.directory / f"{name}.crt"
        key_path = self.directory / f"{name}.key"
        chain_path = self.directory / f"{name}-chain.pem"
        cert_path.write_bytes(_cert_pem(cert))
        key_path.write_bytes(_key_pem(key))
        chain_path.write_bytes(_cert_pem(*chain))
        return Issued(name, cert, key, chain, cert_path, key_path, chain_path)


@dataclass
class PKI:
    """The usual set: a root CA, a server certificate for the loopback
    addresses, a trusted client certificate and a client certificate from
    another (untrusted) CA.

    :ivar ca: the trusted root.
    :ivar server: issued by :attr:`ca` for ``localhost``/``127.0.0.1``/``::1``.
    :ivar client: issued by :attr:`ca`, CN ``client``.
    :ivar other_ca: a root nobody trusts.
    :ivar untrusted_client: issued by :attr:`other_ca`, CN ``client`` too.
    """

    ca: CA
    server: Issued
    client: Issued
    other_ca: CA
    untrusted_client: Issued


def make_pki(directory: Path | str) -> PKI:
    """Create the usual :class:`PKI` in ``directory``."""
    ca = CA.create(directory, "ca", common_name="tbmq test CA")
    other = CA.create(directory, "other-ca", common_name="some other CA")
    return PKI(
        ca=ca,
        server=ca.issue("server", "localhost", server=True),
        client=ca.issue("client", "client"),
        other_ca=other,
        untrusted_client=other.issue("untrusted-client", "client"),
    )
