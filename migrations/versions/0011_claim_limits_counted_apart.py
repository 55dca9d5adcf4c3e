"""claim limits counted apart: fencepost_claim_limits without correlated counts

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 23:59:00

`fencepost_claim_limits` (revision 0008) answers the same rows as before, but
counts what holds each locked queue's slots in statements of their own, before
it answers, rather than in subqueries correlated with each queue's settings.
Citus refuses a correlated subquery over a distributed table beside a
reference table (`queues`), so on Citus the claim could not start; on one
Postgres the counts are the same index scans as before.

Counted only for the queues this claim locked: every other limited queue is
closed to the claim, so its free slots and starts were never read (they are
NULL now). Nothing else changes; no data moves.
"""

import runpy
from pathlib import Path

from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

# Why a function, and why the counts follow the locks: see revision 0008.
CLAIM_LIMITS = """
CREATE OR REPLACE FUNCTION fencepost_claim_limits(workflow_ids text[])
RETURNS TABLE (queue text, concurrency_key text, is_key boolean, closed boolean,
               run_free integer, start_free integer, hold boolean,
               key_run_limit integer, key_start_limit integer)
LANGUAGE plpgsql VOLATILE ROWS 4 AS $$
DECLARE
    q record;
    exclusive text[] := '{}';
    -- What holds slots of the locked queues now: per queue, per key.
    held_queue text[] := '{}';
    held_count bigint[] := '{}';
    key_queue text[] := '{}';
    key_name text[] := '{}';
    key_count bigint[] := '{}';
BEGIN
    -- The queues' settings, shared: a change of them (PUT /v1/queues, a
    -- deploy's declaration) takes this lock exclusively, so it waits for the
    -- claims in flight, and every statement below reads the settings as the
    -- last change before this claim left them.
    PERFORM pg_advisory_xact_lock_shared(1179665746, 0);
    -- A limited queue is locked exclusively, so its claims count and take
    -- slots one at a time; in name order, so two claimers never wait for
    -- each other in a cycle. Only those in which this claimer (running
    -- `workflow_ids`; NULL: any) has due or expired work: the others are
    -- closed for this claim, and claimers of other work never wait for them.
    FOR q IN SELECT s.name FROM queue_settings s WHERE s.limited ORDER BY s.name LOOP
        IF EXISTS (SELECT 1 FROM executions e
                   WHERE e.queue = q.name AND e.status IN ('admitted', 'suspended')
                     AND e.due_at <= now()
                     AND (workflow_ids IS NULL OR e.workflow_id = ANY(workflow_ids)))
           OR EXISTS (SELECT 1 FROM executions e
                      WHERE e.status = 'running' AND e.lease_expires_at <= now()
                        AND e.queue = q.name
                        AND (workflow_ids IS NULL OR e.workflow_id = ANY(workflow_ids)))
        THEN
            PERFORM pg_advisory_xact_lock(1179665745, hashtext(q.name));
            exclusive := exclusive || q.name;
        END IF;
    END LOOP;
    -- From here on each statement sees every claim committed before the
    -- locks were granted.
    IF cardinality(exclusive) > 0 THEN
        -- Starts older than the period no longer limit anything. One
        -- queue at a time, its period a value (Citus refuses now() less a
        -- column in a DELETE from a reference table).
        FOR q IN SELECT s.name, s.rate_limit, s.rate_period FROM queue_settings s
                 WHERE s.name = ANY(exclusive) LOOP
            DELETE FROM queue_starts st
            WHERE st.queue = q.name
              AND (q.rate_limit IS NULL
                   OR st.started_at <= now() - make_interval(secs => q.rate_period));
        END LOOP;
        SELECT coalesce(array_agg(h.queue), '{}'), coalesce(array_agg(h.n), '{}')
        INTO held_queue, held_count
        FROM (SELECT e.queue, count(*) AS n
              FROM executions e JOIN queue_settings s ON s.name = e.queue
              WHERE s.name = ANY(exclusive) AND s.concurrency IS NOT NULL
                AND e.status IN ('running', 'suspended')
                AND ((e.status = 'running' AND e.lease_expires_at > now())
                     OR (s.hold_while_suspended AND e.status = 'suspended'))
              GROUP BY e.queue) h;
        SELECT coalesce(array_agg(h.queue), '{}'), coalesce(array_agg(h.concurrency_key), '{}'),
               coalesce(array_agg(h.n), '{}')
        INTO key_queue, key_name, key_count
        FROM (SELECT e.queue, e.concurrency_key, count(*) AS n
              FROM executions e JOIN queue_settings s ON s.name = e.queue
              WHERE s.name = ANY(exclusive) AND s.per_key_concurrency IS NOT NULL
                AND e.concurrency_key IS NOT NULL
                AND e.status IN ('running', 'suspended')
                AND ((e.status = 'running' AND e.lease_expires_at > now())
                     OR (s.hold_while_suspended AND e.status = 'suspended'))
              GROUP BY e.queue, e.concurrency_key) h;
    END IF;
    -- A limited queue not locked here is closed for this claim; an
    -- unlimited one (a queue that appeared since included: it is unlimited
    -- until a change, which waits for this claim) is open.
    RETURN QUERY
    SELECT s.name, NULL::text, false,
           s.paused OR (s.limited AND NOT s.name = ANY(exclusive)),
           CASE WHEN s.concurrency IS NULL OR NOT s.name = ANY(exclusive) THEN NULL
                ELSE greatest(s.concurrency - coalesce(h.n, 0), 0) END::integer,
           CASE WHEN s.rate_limit IS NULL OR s.rate_per_key OR NOT s.name = ANY(exclusive)
                THEN NULL
                ELSE greatest(s.rate_limit - coalesce(st.n, 0), 0) END::integer,
           s.hold_while_suspended,
           s.per_key_concurrency,
           CASE WHEN s.rate_per_key THEN s.rate_limit END
    FROM queue_settings s
    LEFT JOIN unnest(held_queue, held_count) AS h(queue, n) ON h.queue = s.name
    LEFT JOIN (SELECT x.queue, count(*) AS n
               FROM queue_starts x JOIN queue_settings y ON y.name = x.queue
               WHERE x.queue = ANY(exclusive)
                 AND x.started_at > now() - make_interval(secs => y.rate_period)
               GROUP BY x.queue) st ON st.queue = s.name;
    IF cardinality(exclusive) = 0 THEN
        RETURN;  -- no limited queue: no key is limited either
    END IF;
    -- Keys that hold slots or started within the period, in queues limited
    -- per key; a key not listed has its whole per-key limit free.
    RETURN QUERY
    SELECT k.queue, k.concurrency_key, true, false,
           CASE WHEN s.per_key_concurrency IS NULL THEN NULL
                ELSE greatest(s.per_key_concurrency - sum(k.held), 0) END::integer,
           CASE WHEN s.rate_per_key THEN greatest(s.rate_limit - sum(k.started), 0) END::integer,
           s.hold_while_suspended, s.per_key_concurrency,
           CASE WHEN s.rate_per_key THEN s.rate_limit END
    FROM (
        SELECT h.queue, h.concurrency_key, h.n AS held, 0 AS started
        FROM unnest(key_queue, key_name, key_count) AS h(queue, concurrency_key, n)
        UNION ALL
        SELECT st.queue, st.concurrency_key, 0, 1
        FROM queue_starts st JOIN queue_settings s ON s.name = st.queue
        WHERE s.name = ANY(exclusive) AND s.rate_per_key AND st.concurrency_key IS NOT NULL
          AND st.started_at > now() - make_interval(secs => s.rate_period)
    ) k JOIN queue_settings s ON s.name = k.queue
    GROUP BY k.queue, k.concurrency_key, s.per_key_concurrency, s.rate_per_key, s.rate_limit,
             s.hold_while_suspended;
END
$$
"""


def upgrade() -> None:
    op.execute(CLAIM_LIMITS)


def downgrade() -> None:
    # Revision 0008's text of the function, as it was released.
    previous = runpy.run_path(str(Path(__file__).with_name("0008_queues.py")))["CLAIM_LIMITS"]
    op.execute(previous.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
