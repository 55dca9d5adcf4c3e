"""Example workflows, registered by `make dev` (FENCEPOST_WORKFLOWS=app.examples)."""

from app.examples import refunds, shipping, shop  # noqa: F401
