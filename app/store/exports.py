"""An execution's recorded history, exported for the replay check: what the
code asked for, in order, and what was recorded for each ask."""

from __future__ import annotations

from typing import Any

from app.store.handle import StoreObject
from app.store.types import healed_status_sql

# The document's format; a reader refuses another one rather than guess.
HISTORY_FORMAT = "fencepost-history/1"


class Exports(StoreObject):
    async def export(self, execution_id: str, owner: str | None = None) -> dict[str, Any] | None:
        """The history document of one execution, or None when it does not
        exist or (with `owner`, a trigger-only token's ID) another token
        admitted it. One statement: the record and its steps are read from
        one snapshot, so no step recorded after the status was read is shown
        beside it. Steps in the code's order of asks (position), then those
        with none (legacy rows, concurrent branches) by when they were
        recorded."""
        row = await self.db.fetchrow(
            f"""
            SELECT execution_id, workflow_id, code_version, params, context,
                   {healed_status_sql(self.config.max_unacknowledged)} AS status,
                   -- What a delivery raises into the code (its cleanup follows).
                   CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancel'
                        WHEN deadline <= now() THEN 'deadline' END AS interrupt,
                   (SELECT coalesce(jsonb_agg(jsonb_build_object(
                               'key', s.step_key, 'status', s.status, 'value', s.value,
                               'error', s.error, 'functionName', s.function_name,
                               'attempts', s.attempts, 'position', s.position,
                               'recordedAt', s.recorded_at)
                           ORDER BY s.position NULLS LAST, s.recorded_at, s.step_key), '[]')
                    FROM execution_steps s
                    -- The execution's bucket as a constant: Citus routes on it.
                    WHERE s.execution_id = executions.execution_id
                      AND s.bucket = fencepost_bucket($3)) AS steps
            FROM executions
            WHERE execution_id = $3 AND bucket = fencepost_bucket($3)
              AND ($4::text IS NULL OR admitted_by = $4)
            """,
            self.config.redelivery_base,
            self.config.redelivery_cap,
            execution_id,
            owner,
        )
        if row is None:
            return None
        return {
            "format": HISTORY_FORMAT,
            "executionId": row["execution_id"],
            "workflowId": row["workflow_id"],
            "codeVersion": row["code_version"],
            "status": row["status"],
            "interrupt": row["interrupt"],
            "params": row["params"],
            "context": row["context"],
            "steps": row["steps"],
        }
