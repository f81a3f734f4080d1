"""A server's pod whose notebook command ended before the server was ready: the user's sentence.

KubeSpawner's ``start`` waits for the pod to be Running with every container ready, for up to
``start_timeout`` (5 minutes in Zero to JupyterHub): a notebook command that exits at once (a
typo in the image's command, a config file that cannot be read) keeps the user waiting all that
time and ends in a bare timeout. :func:`notebook_exit` reads the pod as the API server reports it
(untrusted JSON: any shape) and answers, as soon as the pod shows the exit, what the user reads:
the exit code, the reason and the last lines the command printed. Three shapes say so:

* the pod is ``Failed`` (or ``Succeeded``): nothing will restart it;
* the notebook container is ``terminated``;
* the notebook container waits to be restarted (``CrashLoopBackOff``, a real kubelet's answer to
  ``restartPolicy: OnFailure``) after a termination: it ran and exited at least once.

No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tornado import web

# Bounds on what is quoted from the pod: the output is the user's own, but it is shown on a page.
MAX_OUTPUT = 600
MAX_LINES = 10
CONTAINER = "notebook"  # KubeSpawner's container name


class NotebookExited(web.HTTPError):
    """The spawn ends: the notebook's command exited before the server was ready (an HTTPError, as
    JupyterHub relays those to the user and logs them in a line, without a traceback)."""

    def __init__(self, sentence: str) -> None:
        super().__init__(500, "%s", sentence)
        self.sentence = sentence
        self.jupyterhub_message = sentence  # what JupyterHub's spawn-pending page shows

    def __str__(self) -> str:
        return self.sentence


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _quoted(output: str) -> str:
    lines = [line.rstrip() for line in output.strip().splitlines() if line.strip()][-MAX_LINES:]
    text = " / ".join(lines)
    return text if len(text) <= MAX_OUTPUT else "..." + text[-MAX_OUTPUT:]


def _code(terminated: Mapping[str, Any]) -> int | None:
    code = terminated.get("exitCode")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _notebook_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = _map(pod.get("status")).get("containerStatuses")
    if not isinstance(statuses, list):
        return {}
    for status in statuses:
        if isinstance(status, Mapping) and status.get("name") == CONTAINER:
            return status
    return {}


def notebook_exit(pod: Mapping[str, Any] | None) -> str | None:
    """The user's sentence when ``pod``'s notebook command has exited before the server was
    ready; ``None`` while it has not (or the pod says too little to tell)."""
    if not isinstance(pod, Mapping) or _map(pod.get("metadata")).get("deletionTimestamp"):
        return None
    status = _map(pod.get("status"))
    phase = _text(status.get("phase"))
    container = _notebook_status(pod)
    state = _map(container.get("state"))
    terminated = _map(state.get("terminated"))
    restarting = (
        _text(_map(state.get("waiting")).get("reason")) == "CrashLoopBackOff"
        and _map(container.get("lastState")).get("terminated") is not None
    )
    if restarting:
        terminated = _map(_map(container.get("lastState")).get("terminated"))
    if phase not in ("Failed", "Succeeded") and not terminated:
        return None
    code = _code(terminated)
    reason = _text(terminated.get("reason"))
    # The kubelet's termination message (terminationMessagePolicy), else the pod's own message
    # (the local node agent's: the code and the last lines of output).
    output = _text(terminated.get("message")) or _text(status.get("message"))
    output = output.split("last output:", 1)[-1] if "last output:" in output else output
    if reason == "OOMKilled":
        what = "was stopped for using more memory than the server's memory limit (OOMKilled)"
    elif code is not None:
        what = f"exited with code {code}" + (
            f" ({reason})" if reason and reason not in ("Error", "Completed") else ""
        )
    else:
        what = "ended"
    said = f": {_quoted(output)}" if output.strip() else ""
    again = " It keeps failing on each restart." if restarting else ""
    return (
        f"Your server's command {what} before the server was ready{said}.{again} "
        "Check the image and command of the profile you chose, or ask your hub's admin; "
        "the pod's events say more (kubectl describe pod)."
    )


def event_uid(event: Any) -> str:
    """A Kubernetes Event's UID ("" when it has none)."""
    return _text(_map(_map(event).get("metadata")).get("uid"))


def later_events(events: Any, seen: set[str]) -> list[dict[str, Any]]:
    """The pod's events not in ``seen`` (their UIDs, updated here), as KubeSpawner's progress shows
    them: ``<time> [<type>] <message>``."""
    shown = []
    for event in events if isinstance(events, list) else []:
        uid = event_uid(event)
        if not uid or uid in seen or not isinstance(event, Mapping):
            continue
        seen.add(uid)
        when = _text(event.get("lastTimestamp")) or _text(event.get("eventTime"))
        shown.append(
            {
                "progress": 95,
                "raw_event": event,
                "message": f"{when} [{_text(event.get('type'))}] {_text(event.get('message'))}",
            }
        )
    return shown
