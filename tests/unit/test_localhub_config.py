"""The harness hub's configuration file (``LocalHub.config_text``), executed as JupyterHub would."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace

import sqlalchemy
import sqlalchemy.event
from traitlets.config import Config

from gpushare_hub.localcluster.hub import LocalHub


def test_the_harness_hubs_sqlite_file_is_written_without_fsync(tmp_path):
    """JupyterHub commits several times per spawn, each fsync stalling its one event loop: once
    the harness hub's configuration ran, its SQLAlchemy connections say ``synchronous=OFF``
    (0), where sqlite's own default is FULL (2)."""
    plain = sqlite3.connect(tmp_path / "plain.sqlite")
    assert plain.execute("PRAGMA synchronous").fetchone()[0] == 2
    plain.close()
    hub = LocalHub(SimpleNamespace(workdir=tmp_path), "hub")  # type: ignore[arg-type]
    c = Config()
    namespace = {"get_config": lambda: c}
    exec(hub.config_text(8081, "http://127.0.0.1:8001"), namespace)
    try:
        assert c.JupyterHub.db_url == f"sqlite:///{tmp_path / 'hub' / 'jupyterhub.sqlite'}"
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'hub.sqlite'}")
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 0
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "connect", namespace["_no_fsync"])
