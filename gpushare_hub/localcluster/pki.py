"""Certificates, keys and kubeconfigs for a throwaway local control plane.

One CA signs the API server's serving certificate and every client certificate.
Identities follow Kubernetes conventions: ``system:masters`` for the admin,
``system:kube-scheduler`` for the scheduler (bound by the bootstrap RBAC
policy). Nothing here is meant for a real cluster: keys are unencrypted and
live as long as the cluster's temporary folder.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = dt.timedelta(days=2)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


@dataclass(frozen=True)
class Credential:
    cert: Path
    key: Path


class PKI:
    """A CA in ``folder`` and helpers to issue certificates and write kubeconfigs."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.UTC)
        self._ca_key = _key()
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name("gpushare-localcluster-ca"))
            .issuer_name(_name("gpushare-localcluster-ca"))
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = folder / "ca.crt"
        self.ca.write_bytes(self._ca_cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, name: str, cn: str, org: str | None = None, *, server: bool = False, hosts: tuple[str, ...] = ()
    ) -> Credential:
        key = _key()
        now = dt.datetime.now(dt.UTC)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        )
        if hosts:
            sans: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        cred = Credential(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        cred.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        cred.key.write_bytes(_pem_key(key))
        cred.key.chmod(0o600)
        return cred

    def service_account_keys(self) -> tuple[Path, Path]:
        """The key pair the API server signs and checks service-account tokens with."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        priv, pub = self.folder / "sa.key", self.folder / "sa.pub"
        priv.write_bytes(_pem_key(key))
        priv.chmod(0o600)
        pub.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return priv, pub

    def kubeconfig(self, name: str, server: str, cred: Credential) -> Path:
        path = self.folder / f"{name}.kubeconfig"
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "local", "cluster": {"server": server, "certificate-authority": str(self.ca)}}
            ],
            "users": [
                {"name": name, "user": {"client-certificate": str(cred.cert), "client-key": str(cred.key)}}
            ],
            "contexts": [{"name": name, "context": {"cluster": "local", "user": name}}],
            "current-context": name,
        }
        path.write_text(yaml.safe_dump(cfg))
        return path
