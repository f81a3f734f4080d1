"""The hub's side of the gpushare service's rights: its custom scopes and the roles
:func:`~gpushare_hub.service.hubconfig.configure_hub` writes (see that module's docstring for
who gets what), each replacing an earlier one of the same name, so that running the
configuration twice changes nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DISPLAY_NAME = "GPU slices"

# What the service's own hub token may do: list users with their groups, servers and activity.
SERVICE_SCOPES = (
    "list:users",
    "read:users:name",
    "read:users:groups",
    "read:users:activity",
    "read:servers",
)


# JupyterHub's `server` role: what a server's own token holds by default.
SERVER_SCOPES = ("users:activity!user", "access:servers!server")


def admin_scope(name: str = "gpushare") -> str:
    """The custom scope that opens the dashboard and the ledger API of service ``name``."""
    return f"custom:{name}:admin"


def metrics_scope(name: str = "gpushare") -> str:
    """The custom scope that lets a token scrape ``metrics`` (no dashboard access)."""
    return f"custom:{name}:metrics"


def config_section(c: Any, cls: str) -> Mapping[str, Any]:
    return c.get(cls, {})  # type: ignore[no-any-return]


def current_value(c: Any, key: str, empty: Any) -> Any:
    section = config_section(c, "JupyterHub")
    value = section.get(key, empty) if key in section else empty
    # An unset trait reads as a LazyConfigValue in traitlets; only plain values are kept.
    return value if isinstance(value, type(empty)) else empty


def add_scopes(c: Any, name: str) -> None:
    scopes = dict(current_value(c, "custom_scopes", {}))
    scopes[admin_scope(name)] = {
        "description": f"See every user's GPU slices on the {DISPLAY_NAME} dashboard and ledger API.",
        "subscopes": [metrics_scope(name)],
    }
    scopes[metrics_scope(name)] = {"description": f"Scrape the {DISPLAY_NAME} service's Prometheus metrics."}
    c.JupyterHub.custom_scopes = scopes


def returns_servers(service_config: Mapping[str, Any]) -> bool:
    """Whether an idle action, the action on a spent GiB·h budget or the over-slice action stops or
    parks servers (then the service's role may)."""
    actions = [service_config.get("gpu_idle_action", "notify")]
    for key in ("gpu_idle_action_per_group", "gpu_idle_action_per_slice"):
        actions += list((service_config.get(key) or {}).values())
    budgets = service_config.get("quota_gib_hours") is not None or service_config.get(
        "quota_gib_hours_per_group"
    )
    if budgets:
        actions.append(service_config.get("budget_action", "stop"))
    actions.append(service_config.get("over_slice_action", "none"))
    return any(a in ("stop", "park") for a in actions)


def add_roles(
    c: Any,
    name: str,
    admin_users: list[str],
    admin_groups: list[str],
    metrics_services: list[str],
    returns: bool = False,
) -> None:
    """Our roles (replacing earlier ones of the same names), and every user's access to the service.
    ``returns``: the idle rule stops or parks servers, so the service's role gets ``servers``
    (start and stop any user's servers); otherwise it writes nothing."""
    access = f"access:services!service={name}"
    ours = {f"{name}-service", f"{name}-admins", f"{name}-metrics"}
    roles = [dict(r) for r in current_value(c, "load_roles", []) if r.get("name") not in ours]
    roles.append(
        {
            "name": f"{name}-service",
            "description": "The gpushare service reads users, groups, servers and activity"
            + (", and stops or parks servers idle on the GPU." if returns else "."),
            "scopes": list(SERVICE_SCOPES) + (["servers"] if returns else []),
            "services": [name],
        }
    )
    roles.append(
        {
            "name": f"{name}-admins",
            "description": f"Full view of the {DISPLAY_NAME} dashboard.",
            "scopes": [admin_scope(name), access],
            "users": admin_users,
            "groups": admin_groups,
        }
    )
    grant_every_user(roles, access)
    grant_every_server(roles, access)
    if metrics_services:
        roles.append(
            {
                "name": f"{name}-metrics",
                "description": f"Scrape the {DISPLAY_NAME} metrics.",
                "scopes": [metrics_scope(name), access],
                "services": metrics_services,
            }
        )
    c.JupyterHub.load_roles = roles


def grant_every_server(roles: list[dict[str, Any]], access: str) -> None:
    """Every notebook server's own token may call the service (the JupyterLab status bar, the
    out-of-memory note): JupyterHub's "server" role, which such tokens get unless an admin sets
    ``server_token_scopes``, extended (an admin's own "server" role keeps its scopes)."""
    server_role = next((r for r in roles if r.get("name") == "server"), None)
    if server_role is None:
        server_role = {"name": "server", "scopes": list(SERVER_SCOPES)}
        roles.append(server_role)
    server_role["scopes"] = [*[s for s in server_role.get("scopes", SERVER_SCOPES) if s != access], access]


def grant_every_user(roles: list[dict[str, Any]], access: str) -> None:
    """Every user may open the service: JupyterHub's default "user" role, extended."""
    user_role = next((r for r in roles if r.get("name") == "user"), None)
    if user_role is None:
        user_role = {"name": "user", "scopes": ["self"]}
        roles.append(user_role)
    user_role["scopes"] = [*[s for s in user_role.get("scopes", ["self"]) if s != access], access]
