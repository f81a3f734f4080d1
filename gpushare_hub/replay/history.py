"""Where ``gpushare-replay --history`` gets the hub's history: a file exported from
``api/v1/history`` (its JSON document or its CSV), or the hub service itself (``--hub-url``
with a token that has the service's admin scope).

Every row is checked by :func:`~gpushare_hub.core.planning.sessions_of`; an error names the
file and the row as a person finds it (CSV: the spreadsheet's row, the header being row 1).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ..core.planning import PlanningError, Session, read_time, sessions_of
from .trace import TraceError

MAX_BYTES = 256 * 1024 * 1024
SERVICE_PREFIX = "/services/gpushare/"
TOKEN_ENV = "JUPYTERHUB_API_TOKEN"


def _latest(rows: list[dict[str, Any]]) -> float:
    """The latest time a CSV export names: where a slice still held is counted up to."""
    latest = 0.0
    for row in rows:
        if not isinstance(row, dict):
            continue  # named when the row is read
        for column in ("start", "end"):
            try:
                when = read_time(row.get(column), "", column)
            except PlanningError:
                continue  # named when the row is read
            latest = max(latest, when or 0.0)
    return latest


def parse_history(text: str, source: str) -> list[Session]:
    """The sessions of an export: ``api/v1/history``'s JSON document (or a JSON list of its
    rows), or its CSV."""
    start = text.lstrip()[:1]
    if start in ("{", "["):
        try:
            doc = json.loads(text)
        except ValueError as err:
            raise TraceError(f"{source}: not JSON ({err}); give api/v1/history's export") from None
        rows = doc.get("rows") if isinstance(doc, dict) else doc
        if not isinstance(rows, list):
            raise TraceError(f'{source}: a JSON history needs "rows", a list (api/v1/history\'s document)')
        generated = doc.get("generated") if isinstance(doc, dict) else None
        try:
            now = read_time(generated, source, "generated") or _latest(rows)
        except PlanningError as err:
            raise TraceError(str(err)) from None
        return _sessions(rows, lambda i: f"{source}: rows[{i}]", now)
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in ("start", "end", "gib") if c not in header]
    if missing:
        raise TraceError(
            f"{source}: row 1 (header) lacks column(s) {', '.join(missing)}; give api/v1/history's "
            "CSV export (format=csv)"
        )
    rows = list(reader)
    return _sessions(rows, lambda i: f"{source}: row {i + 2}", _latest(rows))


def _sessions(rows: list[Any], where: Any, now: float) -> list[Session]:
    try:
        return sessions_of(rows, where, now)
    except PlanningError as err:
        raise TraceError(str(err)) from None


def read_history(path: Path) -> list[Session]:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as err:
        raise TraceError(f"{path}: cannot read ({err.strerror})") from None
    if len(data) > MAX_BYTES:
        raise TraceError(f"{path}: larger than {MAX_BYTES // 2**20} MiB; export a shorter range")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text; give api/v1/history's CSV or JSON export") from None
    return parse_history(text, str(path))


def history_url(hub_url: str, prefix: str = SERVICE_PREFIX) -> str:
    """``https://hub.example.org`` -> its service's ``api/v1/history`` (JSON, pseudonyms)."""
    parts = urllib.parse.urlsplit(hub_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TraceError(f"--hub-url {hub_url[:80]!r}: give the hub's address, e.g. https://hub.example.org")
    base = hub_url.rstrip("/")
    if base.endswith("/hub"):  # the hub's API address works too
        base = base[: -len("/hub")]
    return f"{base}/{prefix.strip('/')}/api/v1/history?format=json"


def token_from(token_file: Path | None) -> str:
    """The token: ``--token-file``'s first line, else ``$JUPYTERHUB_API_TOKEN``."""
    if token_file is not None:
        try:
            lines = token_file.read_text().strip().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise TraceError(f"--token-file {token_file}: cannot read ({err})") from None
        token = lines[0].strip() if lines else ""
        if not token:
            raise TraceError(f"--token-file {token_file}: the file is empty; write the token in it")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise TraceError(
            f"--hub-url needs a token with the gpushare service's admin scope: put it in ${TOKEN_ENV} "
            "or in a file named by --token-file (an admin makes one on the hub's token page)"
        )
    return token


def fetch_history(
    hub_url: str, token: str, prefix: str = SERVICE_PREFIX, timeout: float = 60
) -> list[Session]:
    url = history_url(hub_url, prefix)
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as err:
        said = err.read(2000).decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):
            said = json.loads(said).get("message", said)
        if err.code in (401, 403):
            raise TraceError(
                f"{url}: the service refused the token (HTTP {err.code}: {said}); the history needs "
                "a token of a hub admin, or one with the scope custom:gpushare:admin"
            ) from None
        raise TraceError(f"{url}: HTTP {err.code}: {said}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TraceError(f"{url}: cannot reach the hub ({reason}); check --hub-url") from None
    if len(data) > MAX_BYTES:
        raise TraceError(f"{url}: the history is larger than {MAX_BYTES // 2**20} MiB")
    return parse_history(data.decode("utf-8", errors="replace"), url)
