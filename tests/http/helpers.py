"""Kept for tests/http/test_openapi_contract.py until it imports from
tests/support/responses.py (where these helpers now live)."""

from tests.support.responses import JSON, assert_error, get_record, post_raw  # noqa: F401
