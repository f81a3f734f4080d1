"""What JupyterHub stores of a REST request's user_options: bounded, so that no request leaves a
Spawner row that JupyterHub cannot decode (which failed every later spawn of every user with 500)."""

from __future__ import annotations

from typing import Any

import pytest
from jupyterhub import orm

from gpushare_hub.core.catalogueread import read_catalogue
from gpushare_hub.spawner.options import MAX_OPTIONS_CHARS, Reason, Refused, check_options
from gpushare_hub.spawner.stored import guard_stored_options

pytestmark = pytest.mark.unit


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture
def db() -> Any:
    guard_stored_options()
    guard_stored_options()  # idempotent: one listener
    session = orm.new_session_factory("sqlite:///:memory:")()
    yield session
    session.close()


def stored(db: Any, options: Any) -> Any:
    user = orm.User(name="mallory")
    db.add(user)
    spawner = orm.Spawner(user=user, name="")
    db.add(spawner)
    spawner.user_options = options  # what User.spawn does with a REST body, before any spawner code
    db.commit()
    db.expire_all()
    (row,) = db.execute(orm.Spawner.__table__.select()).all()
    return row.user_options  # decoded by JupyterHub's JSONDict column, as it loads a Spawner


def test_ordinary_options_are_stored_as_sent(db):
    assert stored(db, {"profile": "t4-5g", "image": "pytorch"}) == {"profile": "t4-5g", "image": "pytorch"}


@pytest.mark.parametrize(
    "options",
    [
        {"profile": nested(900)},  # stored, then undecodable deep in a request: every spawn 500s
        {"profile": nested(9)},
        {"profile": "x" * (MAX_OPTIONS_CHARS + 1)},
    ],
)
def test_options_too_deep_or_too_large_are_not_stored(db, options):
    assert stored(db, options) == {}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"profile": nested(900)}, "user options nest deeper than 8 levels"),
        ({"profile": "x" * 70_000}, "user options are 70015 characters of JSON, more than 65536"),
    ],
)
def test_the_request_itself_is_refused_naming_the_problem(options, message):
    catalogue = read_catalogue([{"slug": "t4-5g", "display_name": "T4 5 GiB", "gib": 5}], [])
    refused = check_options(options, [{"slug": "t4-5g", "display_name": "T4"}], catalogue, ())
    assert isinstance(refused, Refused) and refused.reason is Reason.MALFORMED
    assert refused.text() == f'{message}; send {{"profile": "<slug>"}}'
