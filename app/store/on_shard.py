"""Statements that run where their rows are: one round trip to the node that
owns them, the whole statement in one local transaction there.

On one Postgres an `OnShard` statement is sent as it is written. On Citus
the same text runs inside a function (`fencepost_on_shard_<name>`, created by
`fencepost migrate --citus`) that Citus delegates, by its first argument (a
bucket), to the node holding that bucket's shard, co-located with the
executions. There the function runs the statement against that shard's
tables themselves, as plain PostgreSQL: nothing of it is planned by Citus, so
what Citus refuses in a distributed statement (several modifying CTEs, now()
inside CASE, STABLE functions over columns in an UPDATE, RETURNING now(),
FOR SHARE over several rows) is allowed, and the fence (the token check and
the write under the row's lock) stays one statement on one node. Every row
the statement touches must be in buckets of that one shard: callers split a
batch by shard group (`Placement.group_of`).

The statement's per-execution tables are found by name (FROM/JOIN/INTO/UPDATE
followed by one of PER_EXECUTION); its parameters are $1..$n, typed by
`params`; its answer's columns by `columns` (a test checks both against what
Postgres describes for the plain statement).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from app.store.buckets import PER_EXECUTION

_TABLE_REF = re.compile(
    r"\b(FROM|JOIN|INTO|UPDATE)(\s+)(" + "|".join(PER_EXECUTION) + r")\b", re.IGNORECASE)
# Any mention of a per-execution table (to refuse one left unrenamed).
_TABLE_NAME = re.compile(r"\b(" + "|".join(PER_EXECUTION) + r")\b", re.IGNORECASE)

# The shard of `table` that holds `bucket` (a relation name on the node the
# function was delegated to).
SHARD_FUNCTION = """
CREATE OR REPLACE FUNCTION fencepost_shard(table_name text, bucket smallint) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT shard_name(table_name::regclass,
                      get_shard_id_for_distribution_column(table_name, bucket))
$$
"""

# What a statement's NOTIFY becomes in its shard's copy: nothing, of the same
# type (void, not null). On a worker node a NOTIFY reaches no listener (they
# listen on the coordinator, where the callers send theirs: send_notices,
# tell_claimers), and a transaction that spans nodes (a bulk operation's
# batch, a cancel of a tree) could not commit with one: PREPARE TRANSACTION
# refuses it.
QUIET_NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION fencepost_quiet_notify(channel text, payload text) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN END $$
"""

# Refused, changing nothing, when the rows' buckets are not all on the shard
# the call was delegated to: the caller's placement is out of date (a shard
# split since it was read). Rows written to a shard that does not hold their
# bucket would be invisible to every routed statement, and a claim would
# never look at the buckets that moved away.
#
# A set of buckets found on the shard is remembered for the session (about
# 10 us a bucket: a claim's group of 137 cost 2 ms a call), keyed by the
# statement's name, which holds the shard's ID: a split makes new shards,
# so new IDs and a new check; a move keeps both the IDs and the buckets.
_SAME_SHARD = """    IF current_setting('fencepost.on_' || statement_name, true)
            IS DISTINCT FROM md5(buckets::text) THEN
        IF EXISTS (SELECT 1 FROM unnest(buckets) AS b
                   WHERE get_shard_id_for_distribution_column('executions', b)
                         <> get_shard_id_for_distribution_column('executions', bucket)) THEN
            RAISE EXCEPTION 'fencepost: buckets % are not all on the shard of bucket %',
                buckets, bucket
                USING HINT = 'the shards were split since this process read where the '
                             'buckets are: restart it', ERRCODE = 'FPST1';
        END IF;
        PERFORM set_config('fencepost.on_' || statement_name, md5(buckets::text), false);
    END IF;"""

# An event's (an attempt's) ID, named in the statement rather than left to
# the column's default: a shard's table has no default (Citus drops it there,
# and a shard moved or split is made anew), while on every node the sequence
# itself exists (on a Citus worker node, drawing from that node's own range).
NEXT_EVENT_ID = "nextval('public.execution_events_event_id_seq'::regclass)"
NEXT_ATTEMPT_ID = "nextval('public.attempt_history_attempt_id_seq'::regclass)"
NEXT_SIGNAL_ID = "nextval('public.signals_signal_id_seq'::regclass)"
NEXT_OBSERVATION_ID = "nextval('public.late_observations_observation_id_seq'::regclass)"
NEXT_SUPERSEDED_ID = "nextval('public.superseded_steps_superseded_id_seq'::regclass)"

REGISTRY: dict[str, OnShard] = {}


@dataclass(frozen=True)
class OnShard:
    name: str
    sql: str
    params: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    tables: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        found = tuple(sorted({m.group(3).lower() for m in _TABLE_REF.finditer(self.sql)}))
        if not found:
            raise ValueError(f"{self.name}: names no per-execution table")
        # Fail closed: every mention of a per-execution table must be one the
        # function renames to its shard (a mention in a comment, a literal, a
        # USING or a comma join would run as a distributed query there).
        left = _TABLE_NAME.findall(_TABLE_REF.sub("", self.sql))
        if left:
            raise ValueError(f"{self.name}: mentions {sorted(set(left))} where they cannot be "
                             "renamed to the shard's tables (only after FROM/JOIN/INTO/UPDATE)")
        object.__setattr__(self, "tables", found)
        if REGISTRY.setdefault(self.name, self) is not self:
            raise ValueError(f"{self.name}: two statements of that name")

    @property
    def function(self) -> str:
        return f"fencepost_on_shard_{self.name}"

    @property
    def signature(self) -> str:
        return f"{self.function}(smallint, smallint[], {', '.join(self.params)})"

    @property
    def call(self) -> str:
        args = ", ".join(f"${i + 3}::{t}" for i, t in enumerate(self.params))
        return f"SELECT * FROM {self.function}($1::smallint, $2::smallint[], {args})"

    def ddl(self) -> str:
        """The function that runs this statement on the shard of its first
        argument's bucket (see the module's docstring).

        The statement is prepared once per session (of the coordinator's
        connection to the node) and shard, under a name that carries a hash
        of its text (a new text, a new name), and then only executed: its
        plan is cached as a statement sent by the application is on one
        Postgres. (Planned anew at each call, the claim took 7 ms on the
        node, prepared 0.5 ms.) A session-local setting remembers it is
        prepared; the catalog of prepared statements is read only when that
        setting was lost (a rollback undoes it, not the PREPARE)."""
        body = _TABLE_REF.sub(
            lambda m: f"{m.group(1)}{m.group(2)}__fp_{m.group(3).lower()}__", self.sql
        ).replace("pg_notify(", "fencepost_quiet_notify(")
        if "$fencepost$" in body or "$statement$" in body:
            raise ValueError(f"{self.name}: the statement holds the function's quotes")
        args = ", ".join(f"p{i + 1} {t}" for i, t in enumerate(self.params))
        returns = ", ".join(f"{c} {t}" for c, t in self.columns)
        shards = "\n".join(
            f"            q := replace(q, '__fp_{t}__', fencepost_shard('{t}', bucket));"
            for t in self.tables)
        prefix = f"fp_{self.name}_{hashlib.md5(body.encode()).hexdigest()[:8]}_"
        # The arguments as literals of the EXECUTE (it takes no parameters).
        literals = ", ".join("%L" for _ in self.params)
        values = ", ".join(f"p{i + 1}" for i in range(len(self.params)))
        return (
            f"CREATE OR REPLACE FUNCTION {self.function}(bucket smallint, buckets smallint[], "
            f"{args})\n"
            f"RETURNS TABLE ({returns}) LANGUAGE plpgsql AS $fencepost$\n"
            f"DECLARE\n"
            f"    statement_name text := '{prefix}'\n"
            f"        || get_shard_id_for_distribution_column('executions', bucket);\n"
            f"    q text;\n"
            f"BEGIN\n{_SAME_SHARD}\n"
            f"    IF current_setting('fencepost.' || statement_name, true)\n"
            f"            IS DISTINCT FROM 'prepared' THEN\n"
            f"        IF NOT EXISTS (SELECT 1 FROM pg_prepared_statements s\n"
            f"                       WHERE s.name = statement_name) THEN\n"
            f"            q := $statement${body}$statement$;\n"
            f"{shards}\n"
            f"            EXECUTE format('PREPARE %I({', '.join(self.params)}) AS %s', "
            f"statement_name, q);\n"
            f"        END IF;\n"
            f"        PERFORM set_config('fencepost.' || statement_name, 'prepared', false);\n"
            f"    END IF;\n"
            f"    RETURN QUERY EXECUTE format('EXECUTE %I({literals})', statement_name, "
            f"{values});\n"
            f"END\n$fencepost$")

    async def fetch(self, db: Any, buckets: list[int] | None,
                    *args: Any) -> list[asyncpg.Record]:
        """The statement's rows: sent as it is (`buckets` None: one Postgres),
        or run on the shard of `buckets` (Citus: the buckets of the rows it
        touches, all on one shard)."""
        if buckets is None:
            return list(await db.fetch(self.sql, *args))
        return list(await db.fetch(self.call, buckets[0], buckets, *args))


async def send_notices(db: Any, notices: list[tuple[str, str]]) -> None:
    """NOTIFY each (channel, payload) on `db`'s own connection (delivered when
    its transaction commits; at once outside one). What a statement on a
    shard has to tell listeners is sent this way: on Citus a NOTIFY in the
    function runs on a worker node, where no listener is, and a transaction
    that spans nodes cannot commit one (two-phase commit)."""
    if notices:
        await db.fetch("SELECT count(pg_notify(n.channel, n.payload)) "
                       "FROM unnest($1::text[], $2::text[]) AS n(channel, payload)",
                       [c for c, _ in notices], [p for _, p in notices])

