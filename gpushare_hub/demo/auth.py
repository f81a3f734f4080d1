"""The demo's logins: a fixed set of user names, each with a password the demo made up and printed.

Configured by ``gpushare-demo`` in the hub's configuration file::

    c.JupyterHub.authenticator_class = "gpushare_hub.demo.auth.DemoAuthenticator"
    c.DemoAuthenticator.passwords = {"alice": "...", "bob": "...", "admin": "..."}

Only for a demo on one's own machine: the passwords sit in the hub's configuration file in the
demo's work folder, which only its owner may enter (mode 0700).
"""

from __future__ import annotations

import hmac
from typing import Any

from jupyterhub.auth import Authenticator  # type: ignore[import-untyped]
from traitlets import Dict, Unicode


class DemoAuthenticator(Authenticator):  # type: ignore[misc]
    """Lets in the users of :attr:`passwords` with their password, and nobody else."""

    passwords = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        config=True,
        help="User name -> password of each demo login (gpushare-demo makes them up and prints them).",
    )

    async def authenticate(self, handler: Any, data: dict[str, str]) -> str | None:
        name = (data.get("username") or "").strip()
        expected = self.passwords.get(name)
        given = data.get("password") or ""
        if expected is None or not hmac.compare_digest(expected.encode(), given.encode()):
            self.log.warning("demo login refused for %r", name)
            return None
        return name
