"""Run a kubeconfig's ``exec`` credential plugin and read the ExecCredential it prints.

EKS (``aws eks get-token``), GKE (``gke-gcloud-auth-plugin``) and AKS (``kubelogin``)
kubeconfigs name such a command instead of a token. It is run as kubectl runs it: with its
args and env on top of ours, ``KUBERNETES_EXEC_INFO`` describing the request, our stdin when
it may ask the user something, and its stderr going to ours (its own messages reach the user).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .kubeconfig import Access, ExecPlugin

# A plugin that may not ask the user anything gets this long (it may call a cloud API).
NON_INTERACTIVE_TIMEOUT = 120.0


class CredentialError(Exception):
    """The credential plugin could not give a credential; the message says why and the fix."""


@dataclass(frozen=True)
class Credential:
    """What a plugin gave: a bearer token, or a client certificate and key (PEM)."""

    token: str = field(default="", repr=False)
    cert_pem: bytes = field(default=b"", repr=False)
    key_pem: bytes = field(default=b"", repr=False)


def _command(plugin: ExecPlugin) -> str:
    # kubectl: a command with a path separator is relative to the kubeconfig's folder.
    if "/" in plugin.command and not Path(plugin.command).is_absolute() and plugin.base_dir:
        return str(Path(plugin.base_dir) / plugin.command)
    return plugin.command


def _exec_info(plugin: ExecPlugin, access: Access, interactive: bool) -> str:
    spec: dict[str, Any] = {"interactive": interactive}
    if plugin.provide_cluster_info:
        cluster: dict[str, Any] = {"server": access.server}
        if access.ca_data:
            cluster["certificate-authority-data"] = base64.b64encode(access.ca_data).decode()
        if access.insecure:
            cluster["insecure-skip-tls-verify"] = True
        if access.tls_server_name:
            cluster["tls-server-name"] = access.tls_server_name
        spec["cluster"] = cluster
    return json.dumps({"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": spec})


def run_plugin(plugin: ExecPlugin, access: Access) -> Credential:
    """Run ``plugin`` once and return its credential. Raises CredentialError."""
    command = _command(plugin)
    name = Path(plugin.command).name
    hint = f"; {plugin.install_hint.strip()}" if plugin.install_hint.strip() else ""
    if shutil.which(command) is None:
        raise CredentialError(
            f"the kubeconfig's credential plugin {plugin.command} is not installed (not found on PATH){hint}"
        )
    tty = sys.stdin is not None and sys.stdin.isatty()
    if plugin.interactive_mode == "Always" and not tty:
        raise CredentialError(
            f"the credential plugin {name} needs a terminal to ask for a login (interactiveMode: Always); "
            "run this from a terminal"
        )
    interactive = tty and plugin.interactive_mode != "Never"
    env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": _exec_info(plugin, access, interactive)}
    try:
        done = subprocess.run(
            [command, *plugin.args],
            env=env,
            stdin=None if interactive else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            timeout=None if interactive else NON_INTERACTIVE_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CredentialError(
            f"the credential plugin {name} gave no credential in {NON_INTERACTIVE_TIMEOUT:.0f} s; "
            f"run it yourself to see why: {plugin.command} {' '.join(plugin.args)}"
        ) from None
    except OSError as err:
        raise CredentialError(
            f"cannot run the credential plugin {plugin.command} ({err.strerror}){hint}"
        ) from None
    if done.returncode != 0:
        raise CredentialError(
            f"the credential plugin {name} failed (exit {done.returncode}; its messages are above); "
            "log in again with your cloud's CLI"
        )
    return parse_exec_credential(done.stdout, plugin)


def parse_exec_credential(out: bytes, plugin: ExecPlugin) -> Credential:
    """The credential in a plugin's output. Raises CredentialError when there is none."""
    name = Path(plugin.command).name
    try:
        doc = json.loads(out)
    except ValueError:
        raise CredentialError(f"the credential plugin {name} printed no ExecCredential (not JSON)") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
        raise CredentialError(
            f"the credential plugin {name} printed something other than an ExecCredential"
            " (JSON of kind ExecCredential with status.token or a client certificate)"
        )
    if doc.get("apiVersion") != plugin.api_version:
        raise CredentialError(
            f"the credential plugin {name} answered in {doc.get('apiVersion')}, "
            f"not the {plugin.api_version} the kubeconfig asks for; update the kubeconfig or the plugin"
        )
    status = doc.get("status") or {}
    if not isinstance(status, dict):
        raise CredentialError(
            f"the credential plugin {name} printed an ExecCredential whose status is not an object"
        )
    if status.get("token"):
        return Credential(token=str(status["token"]))
    if status.get("clientCertificateData") and status.get("clientKeyData"):
        return Credential(
            cert_pem=str(status["clientCertificateData"]).encode(),
            key_pem=str(status["clientKeyData"]).encode(),
        )
    raise CredentialError(
        f"the credential plugin {name} gave neither a token nor a client certificate and key"
    )
