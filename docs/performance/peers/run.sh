#!/usr/bin/env bash
# shellcheck disable=SC2317  # the run_* functions and cleanup are called indirectly
# fencepost, DBOS Transact and Absurd on the same Postgres, the same workload
# (a workflow of three recorded steps, N executions started concurrently,
# executions/s from the first start to the last completion), one after another.
#
#   docs/performance/peers/run.sh [N]        (default N: 2000)
#
# Prints one JSON line per system on stdout (progress on stderr). Each peer is
# installed, the first time, into its own venv under .venvs/ beside this script
# (pinned in requirements-<peer>.txt; reinstalled when that file changes).
# With DATABASE_URL set, all three use that server, each in a database of its
# own (fencepost_peers_<system>, dropped and created anew); without it, one
# throw-away embedded Postgres (fencepost's own, as `fencepost bench` starts)
# serves all three and is removed at the end.
#
# Environment: PYTHON (makes the peers' venvs; default python3), FENCEPOST_PYTHON
# (a Python with fencepost installed; default the checkout's .venv), SYSTEMS
# (default "fencepost dbos absurd"), ROUNDS (default 1: each system once; more
# rounds rotate the order, and every line says its round), and the peers' own settings:
# DBOS_ARGS (e.g. "--mode async"), ABSURD_ARGS (e.g. "--workers 2 --concurrency 32").
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
n=${1:-2000}
python=${PYTHON:-python3}
project_python=${FENCEPOST_PYTHON:-$root/.venv/bin/python}
systems=${SYSTEMS:-fencepost dbos absurd}
rounds=${ROUNDS:-1}
venvs=$here/.venvs
# `python -m app.cli` then runs the fencepost of the checkout this script is in
# (the current directory comes first on the module path), its children too.
cd "$root"

log() { echo "run.sh: $*" >&2; }

# The peer's venv, made and filled from its requirements file when that changed.
venv() {
    local peer=$1 dir=$venvs/$1 req=$here/requirements-$1.txt
    if ! cmp -s "$req" "$dir/requirements.txt" 2>/dev/null; then
        log "installing $peer into $dir"
        rm -rf "$dir"
        "$python" -m venv "$dir"
        "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
        cp "$req" "$dir/requirements.txt"
    fi
    echo "$dir/bin/python"
}

load() { cut -d' ' -f1 /proc/loadavg; }

if [ -n "${DATABASE_URL:-}" ]; then
    server=$DATABASE_URL
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/fencepost-peers-XXXXXX")
    cleanup() {
        "$project_python" "$here/postgres.py" stop "$work/pg" >&2 || true
        rm -rf "$work"
    }
    trap cleanup EXIT
    log "starting a throw-away embedded Postgres in $work/pg"
    server=$("$project_python" "$here/postgres.py" start "$work/pg")
fi

cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
log "machine: $(nproc) CPUs ($cpu_model), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); load average now: $(cut -d' ' -f1-3 /proc/loadavg)"

run_fencepost() {
    local url=$1 at
    at=$(load)
    # The bench's own line, with the fields the peers' lines have added.
    DATABASE_URL=$url "$project_python" -m app.cli bench --executions "$n" --quota-executions 0 |
        tail -n 1 |
        LOAD="$at" "$project_python" -c '
import json, os, sys
line = json.loads(sys.stdin.read())
print(json.dumps({
    "system": "fencepost",
    "executions_per_second": line["executions_per_second"],
    "commits_per_execution": line["commits_per_execution"],
    "settings": {"workers": line["workers"], "concurrency": line["concurrency"],
                 "clients": line["clients"], "processes": line["workers"] + 1,
                 "over_http": True, "in_process": False},
    "load_average_1m_at_start": float(os.environ["LOAD"]),
    "bench": line,
}))'
}

run_dbos() {
    # shellcheck disable=SC2086  # DBOS_ARGS is a list of options
    "$(venv dbos)" "$here/dbos_bench.py" "$1" --executions "$n" ${DBOS_ARGS:-}
}

run_absurd() {
    # shellcheck disable=SC2086  # ABSURD_ARGS is a list of options
    "$(venv absurd)" "$here/absurd_bench.py" "$1" --executions "$n" ${ABSURD_ARGS:-}
}

# Each round runs every system once, the order rotated from round to round,
# so that drift in the machine's load does not fall on one system only.
read -r -a order <<<"$systems"
status=0
for ((round = 1; round <= rounds; round++)); do
    for ((i = 0; i < ${#order[@]}; i++)); do
        system=${order[(i + round - 1) % ${#order[@]}]}
        url=$("$project_python" "$here/postgres.py" database "$server" "fencepost_peers_$system")
        log "round $round, $system: $n executions (load average $(load))"
        if ! "run_$system" "$url" | ROUND=$round "$project_python" -c '
import json, os, sys
for line in sys.stdin:
    print(json.dumps({**json.loads(line), "round": int(os.environ["ROUND"])}), flush=True)'
        then
            echo "{\"system\": \"$system\", \"round\": $round, \"error\": \"failed, see above\"}"
            status=1
        fi
    done
done
exit "$status"
