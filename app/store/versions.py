"""Moving executions between code versions: an operator moves executions
whose recorded history the new code replays (checked before the move)."""

from __future__ import annotations

from app.store.handle import StoreObject


class Versions(StoreObject):
    pass
