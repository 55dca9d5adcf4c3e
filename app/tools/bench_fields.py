"""What the fields of `fencepost bench`'s line mean (its --help epilog)."""

FIELDS = """\
fields of the printed line (besides the rates):
  commits_per_execution       pg_stat_database.xact_commit of the bench's database
                              over the end-to-end run, divided by its executions.
                              Everything that commits meanwhile is counted, not
                              subtracted: lease renewals, worker heartbeats,
                              maintenance (sweeps, leadership), the bench's own
                              progress queries.
  api_cpu_s_per_execution     CPU seconds (user+system, /proc) of the API process
  worker_cpu_s_per_execution  ... of the worker processes
  postgres_cpu_s_per_execution  ... of the Postgres server: the postmaster's
                              tree (live backends, exited ones, background
                              processes), so also what other clients of that
                              server cost; null when the server is not on this
                              machine, with postgres_cpu_null_reason. On Citus
                              the sum of every node's server (the coordinator and
                              each worker in its pg_dist_node); null when any one
                              is not on this machine.
                              All three over the end-to-end run, per execution.
  postgres_cpu_servers        how many Postgres servers that sum covers (1, or
                              the Citus nodes with the coordinator).
  --history N adds: executions_per_second_with_history (the same run with N
                              more completed executions kept; its commits and
                              CPU fields end in _with_history), history,
                              history_method, claim_index_scan (EXPLAIN of the
                              claim after the load: no sequential scan of
                              executions), claim_executions_scans.
  --timers N prints instead (mode "timers"): timer_lateness_p50/p99/max_ms and
                              lone_timer_lateness_ms (one timer, idle service);
                              lateness = completion - admission - sleep, on the
                              database clock.
  --citus-url URL adds the same figures measured on URL, each prefixed citus_
                              (citus_executions_per_second, ..._backlog_executions_
                              per_second, ..._admissions_per_second,
                              ..._start_latency_p50_ms, ...), from a run of its own
                              in the same invocation (after the plain one, or
                              before it with --citus-first, also printed), and:
  citus_commits_per_execution the coordinator's own counter (pg_stat_database of
                              URL's database on the coordinator): each client
                              transaction commits there once; what the worker
                              nodes commit for it (the routed statements'
                              transactions, the shards' own) is not counted.
  citus_ratio                 citus_executions_per_second / executions_per_second.
  citus_nodes                 worker nodes (pg_dist_node, primary, active).
"""
