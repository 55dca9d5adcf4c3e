"""An execution's recorded history, exported for the replay check: what the
code asked for, in order, and what was recorded for each ask."""

from __future__ import annotations

from app.store.handle import StoreObject


class Exports(StoreObject):
    pass
