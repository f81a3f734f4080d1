"""Is the way to the API server usable, and where is it? Read from a kubeconfig (kubectl's file) or
from the pod's service account.

``kubeconfig_problem`` and friends are checked before a component starts, so that a wrong
``--kubeconfig`` is named at once instead of surfacing as a client library's traceback (or as a
retry loop that never ends). :func:`read_kubeconfig` and :func:`in_cluster_access` turn the same
sources into an :class:`Access`: the server, how to trust it and how to prove who we are, which
:mod:`gpushare_hub.kube.rest` uses. Files and the environment are read here; no request is made
and no credential plugin is run.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# Where Kubernetes mounts a pod's service-account credentials.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# The ExecCredential versions a credential plugin may speak (v1alpha1 left Kubernetes in 1.24).
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


def kubeconfig_problem(path: str, context: str | None = None) -> str | None:
    """Why the kubeconfig at ``path`` cannot be used, or None. With ``context`` (the one asked
    for), the file needs no current-context."""
    file = Path(path).expanduser()
    if not file.exists():
        return f"--kubeconfig {path}: no such file; give the path of a kubeconfig (kubectl's ~/.kube/config)"
    if file.is_dir():
        return f"--kubeconfig {path} is a folder; give the kubeconfig file in it"
    try:
        doc = yaml.safe_load(file.read_text())
    except OSError as err:
        return f"--kubeconfig {path}: cannot read it ({err.strerror})"
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return f"--kubeconfig {path}: not a kubeconfig (not YAML: {first})"
    if not isinstance(doc, dict) or not doc.get("clusters") or not (context or doc.get("current-context")):
        return (
            f"--kubeconfig {path}: not a kubeconfig (it needs clusters and a current-context); "
            "check it with: kubectl --kubeconfig " + path + " cluster-info"
        )
    return None


def in_cluster_problem() -> str | None:
    """Why the pod's service account cannot be used (not in a pod), or None."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST") or not os.environ.get("KUBERNETES_SERVICE_PORT"):
        return (
            "no --kubeconfig, and not running in a pod (KUBERNETES_SERVICE_HOST is unset): "
            "give --kubeconfig, e.g. --kubeconfig ~/.kube/config"
        )
    return None


def connection_problem(kubeconfig: str | None) -> str | None:
    """:func:`kubeconfig_problem` of ``kubeconfig``, or :func:`in_cluster_problem` without one."""
    return kubeconfig_problem(kubeconfig) if kubeconfig else in_cluster_problem()


# ---- reading a kubeconfig into an Access ------------------------------------------------------


class KubeconfigError(Exception):
    """A kubeconfig (or service account) that cannot be used; the message says why and what to fix.
    It names the context, cluster or user at fault, not the file: the caller knows which file."""


@dataclass(frozen=True)
class ExecPlugin:
    """A user's ``exec`` credential plugin (EKS, GKE and AKS kubeconfigs use one): a command that
    prints an ExecCredential. ``base_dir``: the kubeconfig's folder, for a relative command."""

    command: str
    api_version: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    interactive_mode: str = "IfAvailable"
    install_hint: str = ""
    provide_cluster_info: bool = False
    base_dir: str = ""


@dataclass(frozen=True)
class Access:
    """How to reach one API server and prove who we are. PEM ``*_data`` are the decoded bytes;
    files are absolute paths. ``origin`` says where this came from, for messages."""

    server: str
    origin: str = ""
    ca_file: str = ""
    ca_data: bytes = b""
    insecure: bool = False
    tls_server_name: str = ""
    token: str = field(default="", repr=False)
    token_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    cert_data: bytes = field(default=b"", repr=False)
    key_data: bytes = field(default=b"", repr=False)
    username: str = ""
    password: str = field(default="", repr=False)
    exec: ExecPlugin | None = None


def default_kubeconfig_paths() -> list[str]:
    """kubectl's order: the files of ``$KUBECONFIG`` (``:``-separated), else ``~/.kube/config``."""
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [str(Path("~/.kube/config").expanduser())]


def _load(path: str) -> dict[str, Any]:
    file = Path(path).expanduser()
    try:
        doc = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        raise KubeconfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise KubeconfigError(f"{path} is a folder; give the kubeconfig file in it") from None
    except OSError as err:
        raise KubeconfigError(f"{path}: cannot read it ({err.strerror})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise KubeconfigError(f"{path}: not a kubeconfig (not YAML: {first})") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{path}: not a kubeconfig (not a mapping)")
    return doc


def _merged(paths: Sequence[str]) -> tuple[dict[str, Any], dict[str, dict[str, tuple[dict[str, Any], str]]]]:
    """kubectl's merge of several files: the first file that names an entry (or the current
    context) wins. Every entry keeps the folder of its file (relative paths start there)."""
    top: dict[str, Any] = {}
    entries: dict[str, dict[str, tuple[dict[str, Any], str]]] = {"clusters": {}, "users": {}, "contexts": {}}
    found = 0
    for path in paths:
        if len(paths) > 1 and not Path(path).expanduser().exists():
            continue  # kubectl skips the missing files of a $KUBECONFIG list
        doc = _load(path)
        found += 1
        base = str(Path(path).expanduser().resolve().parent)
        if doc.get("current-context") and "current-context" not in top:
            top["current-context"] = str(doc["current-context"])
        for kind, key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            listed = doc.get(kind) or []
            if not isinstance(listed, list):
                raise KubeconfigError(f"{path}: {kind} is not a list of named entries")
            for item in listed:
                if isinstance(item, dict) and item.get("name") is not None:
                    body = item.get(key) or {}
                    if not isinstance(body, dict):
                        raise KubeconfigError(f"{path}: {key} {item['name']!r} is not a mapping of settings")
                    entries[kind].setdefault(str(item["name"]), (body, base))
    if not found:
        raise KubeconfigError(f"{os.pathsep.join(paths)}: no such file")
    return top, entries


def _file(value: Any, base: str) -> str:
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else Path(base) / path)


def _b64(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise KubeconfigError(f"{what} is not base64; copy it again from the cluster's kubeconfig") from None


def _exec_plugin(spec: Mapping[str, Any], user: str, base: str) -> ExecPlugin:
    version = str(spec.get("apiVersion") or "")
    if version not in EXEC_API_VERSIONS:
        raise KubeconfigError(
            f"user {user!r}: exec apiVersion {version or '(none)'} is not supported; "
            f"use {' or '.join(EXEC_API_VERSIONS)} (a current version of the cloud's CLI writes it)"
        )
    if not spec.get("command"):
        raise KubeconfigError(f"user {user!r}: exec has no command")
    for field_name in ("args", "env"):
        if not isinstance(spec.get(field_name) or [], list):
            raise KubeconfigError(f"user {user!r}: exec {field_name} is not a list")
    env = tuple(
        (str(e.get("name")), str(e.get("value") or ""))
        for e in spec.get("env") or []
        if isinstance(e, dict) and e.get("name")
    )
    return ExecPlugin(
        command=str(spec["command"]),
        api_version=version,
        args=tuple(str(a) for a in spec.get("args") or []),
        env=env,
        interactive_mode=str(spec.get("interactiveMode") or "IfAvailable"),
        install_hint=str(spec.get("installHint") or ""),
        provide_cluster_info=bool(spec.get("provideClusterInfo")),
        base_dir=base,
    )


def _user_fields(user: Mapping[str, Any], name: str, base: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if user.get("token"):
        out["token"] = str(user["token"])
    elif user.get("tokenFile"):
        out["token_file"] = _file(user["tokenFile"], base)
    if user.get("client-certificate-data"):
        out["cert_data"] = _b64(user["client-certificate-data"], f"user {name!r}: client-certificate-data")
    elif user.get("client-certificate"):
        out["cert_file"] = _file(user["client-certificate"], base)
    if user.get("client-key-data"):
        out["key_data"] = _b64(user["client-key-data"], f"user {name!r}: client-key-data")
    elif user.get("client-key"):
        out["key_file"] = _file(user["client-key"], base)
    if bool(out.get("cert_data") or out.get("cert_file")) != bool(out.get("key_data") or out.get("key_file")):
        raise KubeconfigError(f"user {name!r} has a client certificate without its key, or a key without one")
    if user.get("username") and user.get("password"):
        out["username"], out["password"] = str(user["username"]), str(user["password"])
    if isinstance(user.get("exec"), dict):
        out["exec"] = _exec_plugin(user["exec"], name, base)
    provider = user.get("auth-provider")
    if isinstance(provider, dict) and not out:
        config = provider.get("config") or {}
        if provider.get("name") == "oidc" and config.get("id-token"):
            out["token"] = str(config["id-token"])
        else:
            raise KubeconfigError(
                f"user {name!r}: auth-provider {provider.get('name')!r} is not supported (kubectl dropped "
                "it too); use the cloud's exec credential plugin (e.g. gke-gcloud-auth-plugin, kubelogin)"
            )
    return out


def read_kubeconfig(paths: str | Sequence[str] | None = None, context: str | None = None) -> Access:
    """The :class:`Access` of ``context`` (default: the current context) in the kubeconfig at
    ``paths`` (default :func:`default_kubeconfig_paths`). Raises KubeconfigError saying why not."""
    files = (
        default_kubeconfig_paths() if paths is None else [paths] if isinstance(paths, str) else list(paths)
    )
    top, entries = _merged(files)
    name = context or top.get("current-context")
    if not name:
        raise KubeconfigError("no current-context; choose one with: kubectl config use-context NAME")
    if name not in entries["contexts"]:
        known = ", ".join(sorted(entries["contexts"])) or "none"
        raise KubeconfigError(f"no context {name!r} in it (contexts: {known})")
    ctx, _ = entries["contexts"][name]
    cluster_name = str(ctx.get("cluster") or "")
    if cluster_name not in entries["clusters"]:
        raise KubeconfigError(f"context {name!r} names cluster {cluster_name!r}, which it does not define")
    cluster, cluster_base = entries["clusters"][cluster_name]
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"cluster {cluster_name!r} has no https:// server")
    fields: dict[str, Any] = {"server": server, "origin": f"context {name}"}
    if cluster.get("certificate-authority-data"):
        fields["ca_data"] = _b64(
            cluster["certificate-authority-data"], f"cluster {cluster_name!r}: certificate-authority-data"
        )
    elif cluster.get("certificate-authority"):
        fields["ca_file"] = _file(cluster["certificate-authority"], cluster_base)
    insecure = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool):
        # kubectl refuses anything but a YAML boolean: a quoted "false" must not turn checks off.
        raise KubeconfigError(
            f"cluster {cluster_name!r}: insecure-skip-tls-verify is {insecure!r}, not true or false; "
            "write it without quotes"
        )
    if insecure and ("ca_data" in fields or "ca_file" in fields):
        raise KubeconfigError(
            f"cluster {cluster_name!r} names a certificate authority and insecure-skip-tls-verify: true;"
            " keep one of them (kubectl refuses both)"
        )
    fields["insecure"] = insecure
    fields["tls_server_name"] = str(cluster.get("tls-server-name") or "")
    user_name = str(ctx.get("user") or "")
    if user_name:
        if user_name not in entries["users"]:
            raise KubeconfigError(f"context {name!r} names user {user_name!r}, which it does not define")
        user, user_base = entries["users"][user_name]
        fields.update(_user_fields(user, user_name, user_base))
    return Access(**fields)


def in_cluster_access(folder: str = SERVICE_ACCOUNT_DIR) -> Access:
    """The pod's service account: its token and CA, and the API server the pod's environment
    names. Raises KubeconfigError when not in a pod or when the token is not mounted."""
    if problem := in_cluster_problem():
        raise KubeconfigError(problem)
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    token = Path(folder) / "token"
    if not token.is_file():
        raise KubeconfigError(
            f"in a pod, but {token} is missing: mount the service account's token "
            "(automountServiceAccountToken: true)"
        )
    return Access(
        server=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}",
        origin="the pod's service account",
        ca_file=str(Path(folder) / "ca.crt"),
        token_file=str(token),
    )
