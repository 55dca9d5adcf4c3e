#!/usr/bin/env bash
# Profiles of the API and of one worker while `fencepost bench` runs its
# end-to-end phase (admissions over HTTP while the workers run them).
#
#   docs/performance/profile.sh [OUT_DIR]        (default: ./profiles)
#
# Needs py-spy in the same environment as fencepost (`pip install py-spy`) and psql.
# Environment: EXECUTIONS (default 12000, so that the end-to-end phase covers
# the sampling window), SECONDS_EACH (default 15), RATE (samples/s, default 100), FENCEPOST (default: fencepost on PATH),
# PYSPY_FLAGS (default --nonblocking; "--native" pauses the process at each
# sample but names the C/Cython frames: uvloop, asyncpg's protocol).
# Both processes are sampled at the same time for SECONDS_EACH. py-spy drops
# samples it judges idle, but a uvloop waiting in epoll is not reliably told
# apart from work (without --native it shows as own time of Runner.run): read
# the shares as shares of recorded samples, not of CPU; the bench line gives
# the CPU per execution. Writes api.raw, worker.raw (collapsed stacks,
# "frame;frame;... count"), bench.json and summary.txt (top frames by own and
# cumulative time, and by category).
set -euo pipefail

out=${1:-profiles}
executions=${EXECUTIONS:-12000}
seconds=${SECONDS_EACH:-15}
rate=${RATE:-100}
flags=${PYSPY_FLAGS:---nonblocking}
fencepost=${FENCEPOST:-fencepost}
bin=$(dirname "$(command -v "$fencepost")")
pyspy=$bin/py-spy
mkdir -p "$out"

"$fencepost" bench --executions "$executions" --quota-executions 0 >"$out/bench.json" &
bench=$!

# The bench's own children only (other benches may run on this machine).
child() { pgrep -P "$bench" -f "app.cli $1" | head -n 1; }
until api=$(child api) && [ -n "$api" ]; do sleep 0.2; done
url=$(tr '\0' '\n' <"/proc/$api/environ" | sed -n 's/^DATABASE_URL=//p' | sed 's/+asyncpg//')

# The end-to-end phase admits executions named "<run>-mixed-<i>".
until [ "$(psql -Atq "$url" -c "SELECT count(*) FROM executions WHERE execution_id LIKE '%-mixed-%'" 2>/dev/null || echo 0)" -gt 0 ]; do
    sleep 0.2
done
worker=$(child worker)
echo "end-to-end phase started; api pid $api, worker pid $worker" >&2

"$pyspy" record $flags --rate "$rate" --duration "$seconds" --format raw \
    --pid "$api" --output "$out/api.raw" &
"$pyspy" record $flags --rate "$rate" --duration "$seconds" --format raw \
    --pid "$worker" --output "$out/worker.raw" &
wait %2 %3 || true
wait "$bench"
cat "$out/bench.json"

# Top frames by own and cumulative time, and by category, of each profile.
"$bin/python" - "$out/api.raw" "$out/worker.raw" <<'PY' | tee "$out/summary.txt"
import re
import sys
from collections import Counter, defaultdict

FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
ASYNCPG_C = ("protocol.c", "pgproto.c", "recordobj.c")
UVLOOP_C = ("loop.c", "core.c", "linux.c", "stream.c", "loop-watcher.c", "timer.c", "heap-inl.h",
            "queue.h", "handles.c", "uv-common.c", "poll.c")
# The process's entry frames, on (nearly) every stack: left out of the cumulative list.
RUNNER = ("<frozen runpy>", "app/cli.py", "app/serve.py", "uvloop/__init__.py",
          "asyncio/runners.py", "uvicorn/server.py", "uvicorn/_compat.py")


def category(func, file):
    if func.startswith("epoll_"):
        return "waiting in epoll (idle)"
    if file.startswith("libc.so") and func in ("write", "read", "writev", "sendto", "recvfrom",
                                                "send", "recv", "sendmsg", "recvmsg"):
        return "socket syscalls (read/write)"
    if func == "gc_collect_main" or file == "gcmodule.c":
        return "garbage collector"
    if file.startswith("json/") or file == "_json.c":
        return "JSON (json module)"
    if file.startswith(("pydantic/", "pydantic_core/")):
        return "pydantic"
    if file.startswith("asyncpg/") or file in ASYNCPG_C:
        return "asyncpg"
    if file.startswith("logging/") or file == "app/logs.py":
        return "logging"
    if file.startswith(("uvicorn/", "h11/", "httptools/")):
        return "HTTP server (uvicorn, httptools)"
    if file.startswith(("starlette/", "fastapi/", "anyio/")):
        return "framework (starlette, fastapi)"
    if file.startswith(("opentelemetry/", "trace/", "context/", "prometheus_client/")):
        return "tracing and metrics (otel, prometheus)"
    if file.startswith("uvloop/") or file in UVLOOP_C:
        return "event loop (uvloop)"
    if file.startswith("asyncio/") or file == "_asynciomodule.c" or file == "selectors.py":
        return "asyncio (tasks, futures, timeouts)"
    if file.startswith("app/"):
        return "fencepost (app/)"
    if not file.endswith(".py") and not file.startswith("<"):
        return "other native (interpreter, libc)"
    return "other Python (stdlib, libraries)"


def parse(path):
    for raw in open(path):
        stack, _, n = raw.rstrip("\n").rpartition(" ")
        frames = [m for m in (FRAME.match(s) for s in stack.split(";")) if m]
        yield [(m["func"], m["file"], m["line"]) for m in frames], int(n)


def python(frames):
    return [f for f in frames if f[2] is not None and f[1].endswith(".py") or f[1].startswith("<")]


def pct(n, total):
    return f"{n / total:6.1%}"


def summary(path, top):
    total = truncated = 0
    own_cat, incl, own_py, own_native = Counter(), Counter(), Counter(), Counter()
    cum, lines = Counter(), defaultdict(Counter)
    for frames, n in parse(path):
        total += n
        if not frames:
            own_cat["(no stack read)"] += n
            continue
        py = python(frames)
        if not any(f[0] == "_run_module_as_main" for f in frames):
            truncated += n
        func, file, line = frames[-1]
        own_cat[category(func, file)] += n
        own_native[f"{func} ({file}{':' + line if line else ''})"] += n
        if py:
            func, file, line = py[-1]
            own_py[f"{func} ({file}:{line})"] += n
        for c in {category(f, fl) for f, fl, _ in frames}:
            incl[c] += n
        seen = set()
        for func, file, line in py:
            key = f"{func} ({file}"
            lines[key][line] += n
            if key not in seen and file not in RUNNER:
                seen.add(key)
                cum[key] += n
    native = own_native != own_py
    print(f"## {path}: {total} samples; {pct(truncated, total).strip()} of stacks truncated "
          "(read while the process ran on)\n")
    print("by category: own time (leaf frame) | on the stack (any frame)")
    for c, n in own_cat.most_common():
        print(f"  {pct(n, total)} {pct(incl[c], total)}  {c}")
    if native:
        print(f"\ntop {top} by own time, native leaf frames")
        for k, n in own_native.most_common(top):
            print(f"  {pct(n, total)}  {k}")
    print(f"\ntop {top} by own time, innermost Python frame (C code below it counted to it)")
    for k, n in own_py.most_common(top):
        print(f"  {pct(n, total)}  {k}")
    print(f"\ntop {top} by cumulative time, Python frames (entry frames left out; "
          "file:line = the line sampled most)")
    for k, n in cum.most_common(top):
        print(f"  {pct(n, total)}  {k}:{lines[k].most_common(1)[0][0]})")
    print()


for p in sys.argv[1:]:
    summary(p, top=15)
PY
