"""What runs inside a user's notebook server: its GPU slice, shown to the user.

``sliceinfo.py`` reads the slice from the server's environment (pure); ``status.py`` puts it
together with the hub service's ``api/v1/me`` document into the status words (pure);
``hubclient.py`` fetches that document (tornado, cached); ``slicepage.py`` is the Jupyter server
extension (``<base>gpushare``, ``gpushare/api``, ``gpushare/api/status``); ``install.py`` puts
the built JupyterLab extension and the server extension's config under a Python prefix;
``build.py`` builds the JupyterLab extension from ``labextension/`` (npm, tooling only).
"""

from __future__ import annotations

# The JupyterLab extension's npm name (labextension/package.json) and where its build lands.
LABEXTENSION_NAME = "gpushare-hub-statusbar"
SERVER_EXTENSION = "gpushare_hub.notebook.slicepage"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """For ``jupyter labextension develop``: the built extension inside this package."""
    return [{"src": "labextension", "dest": LABEXTENSION_NAME}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": SERVER_EXTENSION}]
