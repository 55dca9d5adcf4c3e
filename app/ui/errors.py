"""The dashboard's refusals: the commands' one error type, rendered as a page
(with the viewer's session when it is known), and the redirect to sign in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.commands import DASHBOARD
from app.commands.errors import CommandError, execution_not_found

if TYPE_CHECKING:
    from app.ui.session import Session


class UIError(CommandError):
    """A refusal rendered as the error page, for `session` (None: as to a
    visitor not signed in)."""

    def __init__(self, http_status: int, code: str, message: str, *,
                 session: Session | None = None, headers: dict | None = None):
        super().__init__(http_status, code, message, headers=headers)
        self.session = session


class LoginRequired(Exception):
    def __init__(self, next_url: str, reason: str | None = None):
        self.next_url, self.reason = next_url, reason


def not_found(execution_id: str, session: Session | None = None) -> UIError:
    exc = execution_not_found(execution_id, DASHBOARD)
    return UIError(exc.http_status, exc.code, exc.message, session=session)
