"""Add the gpushare hub service to a JupyterHub configuration (``jupyterhub_config.py``).

:func:`configure_hub` writes everything the hub needs to run the service as a hub-managed
process and to show "GPU slices" in its Services menu: the ``c.JupyterHub.services`` entry,
the custom scopes, and three roles:

- ``<name>-service``: the service's own token. It reads the hub's users, their groups and
  servers (started, last activity) and nothing else: no ``admin:*``, no ``servers`` write,
  unless an idle action (``c.GPUShareService.gpu_idle_action`` and its per-group and per-slice
  forms) or the action on a spent GiB·h budget (``budget_action``) stops or parks servers:
  then it also holds ``servers``.
- ``<name>-admins``: ``custom:<name>:admin`` (the dashboard and ``api/v1/ledger``) for
  ``admin_users`` / ``admin_groups``.
- the default ``user`` role gains ``access:services!service=<name>``: every user may open the
  service (it shows in their menu; they get ``api/v1/availability`` and ``api/v1/me``, and a
  403 page naming the missing scope on the dashboard).

The service's own settings (catalogue, node selector, quotas) travel in the environment
variable :data:`CONFIG_ENV` as JSON, read by ``python -m gpushare_hub.service``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from traitlets.config import Application

from gpushare_hub.accounting.quotas import QUOTA_SETTINGS
from gpushare_hub.accounting.zones import budget_zone

from .address import free_port, listen_on
from .hubroles import (
    DISPLAY_NAME,
    add_roles,
    add_scopes,
    admin_scope,
    config_section,
    current_value,
    metrics_scope,
    returns_servers,
)

CONFIG_ENV = "GPUSHARE_SERVICE_CONFIG"
# A page.html that extends JupyterHub's and names a service by its info["display_name"].
TEMPLATES = str(Path(__file__).parent / "templates")


def configure_hub(
    c: Any,
    *,
    name: str = "gpushare",
    slices: list[dict[str, Any]] | None = None,
    admin_users: Iterable[str] = (),
    admin_groups: Iterable[str] = (),
    port: int | None = None,
    kubeconfig: str | None = None,
    environment: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    metrics_services: Iterable[str] = (),
    url: str | None = None,
) -> None:
    """Add the hub-managed gpushare service to a JupyterHub config object ``c``.

    - ``c.JupyterHub.services`` gets an entry ``name`` running ``python -m gpushare_hub.service``,
      shown as "GPU slices" in the Services menu (``c.JupyterHub.template_paths`` gets a
      ``page.html`` that extends JupyterHub's and shows ``info["display_name"]``), on
      ``http://127.0.0.1:<port>`` (a free port when ``port`` is None).
    - ``c.JupyterHub.custom_scopes`` gets ``custom:<name>:admin`` and ``custom:<name>:metrics``.
    - ``c.JupyterHub.load_roles`` gets the service's least-privilege role, a role granting
      ``custom:<name>:admin`` to ``admin_users`` / ``admin_groups``, one granting every user
      access to the service (JupyterHub's default ``user`` role, extended), and (when
      ``metrics_services`` names some) one granting those services ``custom:<name>:metrics``.

    ``slices``: the GPUShareSpawner catalogue (same dict format); None reads
    ``c.GPUShareSpawner.slices``. ``node_selector``: the labels GPU pods carry as their node
    selector (availability counts only such nodes); None merges ``c.GPUShareSpawner.node_selector``
    (or KubeSpawner's) with ``c.GPUShareSpawner.gpu_node_selector``. ``kubeconfig``: passed to
    the service as ``KUBECONFIG`` (None: the hub's own ``$KUBECONFIG`` if set; else, when the hub
    runs in a pod, the pod's service account). ``environment``: more variables for the service's process.

    Settings of the service itself written in the same file (``c.GPUShareService.gpu_idle_after
    = 7200``) go to it as they are; an unknown name stops the hub at start with the names known.

    ``url``: where the proxy reaches the service, when the proxy is not on the hub's machine
    (Zero to JupyterHub runs it in its own pod: ``http://hub:10101``, with that port added to the
    hub's Kubernetes Service and NetworkPolicy, see ``examples/z2jh-values.yaml``). Its port must
    be given; a host other than a loopback address makes the service listen on every interface
    of that port (each request still needs a hub token). None: ``http://127.0.0.1:<port>``.
    """
    spawner = config_section(c, "GPUShareSpawner")
    kube = config_section(c, "KubeSpawner")
    service_config = _service_config(name, spawner, kube, slices, node_selector)
    service_config.update(_own_settings(config_section(c, "GPUShareService")))
    service_config.setdefault("state_db", _beside_hub_db(current_value(c, "db_url", "")))
    if "budget_db" not in spawner:  # the spawner reads the GiB·h book the service keeps there
        c.GPUShareSpawner.budget_db = os.path.abspath(service_config["state_db"])
    env = _kube_access(kubeconfig, service_config)
    url = _service_url(url, port, service_config)
    env[CONFIG_ENV] = json.dumps({"GPUShareService": service_config})
    env.update(environment or {})
    _add_service(c, name, url, env)
    _tell_servers(c, name, url)
    add_scopes(c, name)
    add_roles(
        c,
        name,
        list(admin_users),
        list(admin_groups),
        list(metrics_services),
        returns_servers(service_config),
    )


# What configure_hub computes from its arguments and the spawner's settings: not set apart.
_COMPUTED = frozenset({"slices", "node_selector", "admin_scope", "metrics_scope", "config_file"})


def _own_settings(section: Mapping[str, Any]) -> dict[str, Any]:
    """``c.GPUShareService.<name>`` values the admin set, checked against the service's settings."""
    from .settings import ServiceSettings  # GPUShareService's settings are all ServiceSettings'

    own = set(ServiceSettings.class_traits(config=True)) - set(Application.class_traits(config=True))
    known = own - _COMPUTED
    wrong = sorted(set(section) - known)
    if wrong:
        raise ValueError(
            f"c.GPUShareService has no setting {', '.join(wrong)}; the service's settings are "
            f"{', '.join(sorted(known))} (slices and node_selector come from GPUShareSpawner or "
            "configure_hub's arguments)"
        )
    return {key: value for key, value in section.items() if type(value).__name__ != "LazyConfigValue"}


def _node_selector(spawner: Mapping[str, Any], kube: Mapping[str, Any]) -> dict[str, str]:
    """The spawner's node selector (its own, else KubeSpawner's) merged with its gpu_node_selector."""
    selector: dict[str, str] = {}
    for section in (kube, spawner):
        if "node_selector" in section:
            selector.update(section["node_selector"])
    if "gpu_node_selector" in spawner:
        selector.update(spawner["gpu_node_selector"])
    return selector


def _service_config(
    name: str,
    spawner: Mapping[str, Any],
    kube: Mapping[str, Any],
    slices: list[dict[str, Any]] | None,
    node_selector: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The service's own settings, from the arguments and the spawner's; the catalogue checked."""
    if slices is None:
        slices = list(spawner.get("slices", [])) if "slices" in spawner else []
    if node_selector is None:
        node_selector = _node_selector(spawner, kube)
    service_config: dict[str, Any] = {
        "slices": slices,
        "node_selector": dict(node_selector),
        "admin_scope": admin_scope(name),
        "metrics_scope": metrics_scope(name),
    }
    # The spawner's namespace: only pods there are attributed to hub users (see hub_namespaces).
    for section in (kube, spawner):
        if isinstance(section.get("namespace"), str) and section["namespace"]:
            service_config["hub_namespaces"] = [section["namespace"]]
    for key in ("gpu_memory_resource", "gpu_count_resource", *QUOTA_SETTINGS):
        if key in spawner:
            service_config[key] = spawner[key]
    # Check the catalogue now, with the spawner's rules, so a mistake stops the hub at start.
    from gpushare_hub.core.catalogueread import read_catalogue

    read_catalogue(slices)
    _check_budget_settings(service_config)
    return service_config


def _check_budget_settings(settings: Mapping[str, Any]) -> None:
    """A budget window or time zone the spawner and the service would refuse stops the hub at start."""

    from gpushare_hub.core.budget import WINDOWS

    window = settings.get("quota_gib_hours_window", "week")
    if window not in WINDOWS:
        raise ValueError(
            f"c.GPUShareSpawner.quota_gib_hours_window is {window!r}: use one of {', '.join(WINDOWS)}"
        )
    budget_zone(settings.get("quota_gib_hours_timezone", "UTC"), "c.GPUShareSpawner.quota_gib_hours_timezone")


def _kube_access(kubeconfig: str | None, service_config: dict[str, Any]) -> dict[str, str]:
    """The service's variables for reaching the API server: a kubeconfig, or (the hub in a pod)
    the pod's service account, which also sets ``in_cluster`` in ``service_config``."""
    env: dict[str, str] = {}
    # JupyterHub gives a service almost none of its own environment; without HOME, a hub user
    # with no passwd entry (an arbitrary UID) has no home directory, and the Kubernetes client
    # fails to import.
    if os.environ.get("HOME"):
        env["HOME"] = os.environ["HOME"]
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        # The hub runs in a pod: the service (a child of the hub, same pod) uses its service
        # account; JupyterHub passes a service only the variables it is given.
        service_config["in_cluster"] = True
        for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
            env[var] = os.environ.get(var, "")
    return env


def _service_url(url: str | None, port: int | None, service_config: dict[str, Any]) -> str:
    """Where the proxy reaches the service; for a given ``url``, its ip and port in ``service_config``."""
    if url is None:
        return f"http://127.0.0.1:{port or free_port()}"
    service_config.update(listen_on(url, port))
    return url


def _tell_servers(c: Any, name: str, url: str) -> None:
    """Notebook servers learn where the service is (``GPUShareSpawner.service_url``); their
    tokens may call it through JupyterHub's ``server`` role (see :func:`grant_every_server`)."""
    if not config_section(c, "GPUShareSpawner").get("service_url"):
        c.GPUShareSpawner.service_url = f"{url.rstrip('/')}/services/{name}/"


def _add_service(c: Any, name: str, url: str, env: dict[str, str]) -> None:
    """The ``c.JupyterHub.services`` entry (replacing one of that name) and our page.html's folder."""
    services = [s for s in current_value(c, "services", []) if s.get("name") != name]
    services.append(
        {
            "name": name,
            # JupyterHub's menu shows the name; our page.html (TEMPLATES) shows this instead.
            "info": {"display_name": DISPLAY_NAME},
            "url": url,
            "command": [sys.executable, "-m", "gpushare_hub.service"],
            "environment": env,
            "oauth_no_confirm": True,
            # OAuth tokens of the dashboard may carry these when the user holds them; a hub
            # admin's carries admin-ui (JupyterHub's admin role), which opens the dashboard.
            "oauth_client_allowed_scopes": [admin_scope(name), metrics_scope(name), "admin-ui"],
        }
    )
    c.JupyterHub.services = services
    paths = list(current_value(c, "template_paths", []))
    if TEMPLATES not in paths:
        c.JupyterHub.template_paths = [*paths, TEMPLATES]  # an admin's own page.html still wins


def _beside_hub_db(db_url: str) -> str:
    """The service's SQLite file beside the hub's own database when that is a SQLite file (the
    hub's volume in Zero to JupyterHub), else in the hub's working folder."""
    name = "gpushare-service.sqlite"
    if db_url.startswith("sqlite:///") and db_url != "sqlite:///:memory:":
        path = db_url[len("sqlite:///") :].split("?", 1)[0]
        return str(Path(path).with_name(name)) if path else name
    return name
