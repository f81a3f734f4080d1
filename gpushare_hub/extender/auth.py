"""Who may call the extender's verbs (filter, prioritize, bind) and ``/inspect``: pure decisions.

With a host-network scheduler, anything on the node's network can reach the
extender's port, and ``/bind`` writes bindings with the extender's identity. So a
caller must prove itself in one of two ways:

* **mutual TLS**: a client certificate signed by the CA given as
  ``--tls-client-ca`` (kube-scheduler sends one from its extender ``tlsConfig``);
  the TLS handshake checks it, so a request that arrives with a certificate has one
  the CA signed. Use a CA that signs nothing but these client certificates.
* **bearer token**: ``Authorization: Bearer <token>``, with the token read from
  ``--token-file`` (for callers that cannot hold a certificate, e.g. a proxy).

``/metrics``, ``/healthz`` and ``/readyz`` are served on their own port and ask
for neither, so that Prometheus and probes need no access to ``/bind``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from enum import Enum


class Denial(Enum):
    """Why a call was refused."""

    NO_CREDENTIAL = "no-credential"
    BAD_TOKEN = "bad-token"


@dataclass(frozen=True)
class CallerPolicy:
    """What the extender accepts. Neither set: anyone who reaches the port (local sidecar only)."""

    token: str = ""
    client_certs: bool = False

    @property
    def open(self) -> bool:
        return not self.token and not self.client_certs

    def check(self, has_client_cert: bool, authorization: str | None) -> Denial | None:
        """``None`` if the caller may proceed, else why not."""
        if self.open or (self.client_certs and has_client_cert):
            return None
        if self.token and authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(
                value.strip().encode(), self.token.encode()
            ):
                return None
            return Denial.BAD_TOKEN
        return Denial.NO_CREDENTIAL

    def explain(self, denial: Denial) -> str:
        """The refusal as the caller reads it: what was wrong and what to present instead."""
        ways = []
        if self.client_certs:
            ways.append(
                "a client certificate signed by the extender's --tls-client-ca (kube-scheduler's tlsConfig)"
            )
        if self.token:
            ways.append(
                "the header 'Authorization: Bearer <token>' with the token of the extender's --token-file"
            )
        problem = (
            "the bearer token does not match" if denial is Denial.BAD_TOKEN else "no credential was sent"
        )
        return f"unauthorized: {problem}; present {' or '.join(ways)}"
