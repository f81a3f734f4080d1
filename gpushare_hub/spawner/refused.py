"""SpawnRefused: a spawn refused with its HTTP status and the words the user reads."""

from __future__ import annotations

from tornado import web

from .options import Reason, Refused

_STATUS = {
    Reason.MALFORMED: 400,
    Reason.UNKNOWN_PROFILE: 400,
    Reason.UNKNOWN_KEY: 400,
    Reason.BAD_CHOICE: 400,
    Reason.GROUP: 403,
    Reason.QUOTA: 403,
    Reason.BUDGET: 403,
    Reason.UNAVAILABLE: 409,
    Reason.NEVER_FITS: 409,
}


class SpawnRefused(web.HTTPError):
    """A spawn request refused with a reason the user reads (form, REST reply, progress page)."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(_STATUS[refused.reason], "%s", refused.text())
        self.refused = refused
        self.jupyterhub_message = refused.text()

    def __str__(self) -> str:
        return self.refused.text()
