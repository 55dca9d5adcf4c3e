# One image for every role: `api` (the default), `worker`, `migrate`, `tokens`, ...
#   docker build -t fencepost .
#   docker run --rm -e DATABASE_URL=... fencepost migrate
#   docker run -e DATABASE_URL=... -e FENCEPOST_WORKFLOWS=app.examples fencepost worker
# Both stages use the same base, so the venv's interpreter links stay valid. The
# base is pinned to a release (the Python the tests run on, Debian bookworm); add
# an @sha256 digest where the registry is reachable to pin it byte for byte.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

# ---------------------------------------------------------------- builder
FROM ${PYTHON_IMAGE} AS builder

# Compilers only in this stage, for any dependency without a wheel for the platform.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*

RUN python -m venv /opt/venv
WORKDIR /src

# Dependencies first (from pyproject.toml's [project] dependencies, no extras: the
# image talks to a real Postgres, never the embedded one), so a code change does
# not reinstall them. Every version comes from constraints.txt (the versions the
# tests ran with); PIP_CONSTRAINT also pins the setuptools that builds the wheel.
COPY pyproject.toml README.md constraints.txt ./
ENV PIP_CONSTRAINT=/src/constraints.txt PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt --upgrade pip \
 && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt -r /tmp/requirements.txt

COPY alembic.ini ./
COPY app ./app
COPY migrations ./migrations
RUN /opt/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps /wheels/fencepost-*.whl

# app/migrate.py looks for migrations/ beside the `app` package directory: put it
# (and alembic.ini, for the alembic command line) next to the installed package,
# then prove from outside the source tree that the installed code finds it.
RUN site="$(/opt/venv/bin/python -I -c 'import app, pathlib; print(pathlib.Path(app.__file__).resolve().parent.parent)')" \
 && cp -r migrations alembic.ini "$site/" \
 && cd / \
 && /opt/venv/bin/python -I -c "from app.migrate import MIGRATIONS, head_revision; print('migrations', MIGRATIONS, 'head', head_revision())"

# ------------------------------------------------------------------ final
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="fencepost" \
      org.opencontainers.image.description="Durable workflows on PostgreSQL, served over HTTP"

RUN groupadd --system --gid 10001 fencepost \
 && useradd --system --uid 10001 --gid fencepost --home-dir /srv/fencepost \
            --no-create-home --shell /usr/sbin/nologin fencepost \
 && mkdir -p /srv/fencepost/workflows

COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH
ENV PYTHONUNBUFFERED=1
ENV PYTHONDONTWRITEBYTECODE=1
# Teams mount (or COPY, in an image built FROM this one) their workflow modules
# here and name them in FENCEPOST_WORKFLOWS.
ENV PYTHONPATH=/srv/fencepost/workflows

# Fail the build, not the deployment, if the installed code cannot find its
# migrations or the CLI does not start without the embedded extra.
RUN python -c "from app.migrate import head_revision; head_revision()" \
 && fencepost --help > /dev/null

WORKDIR /srv/fencepost
USER 10001:10001
EXPOSE 8000

# Liveness of the API role (slim has no curl). Compose overrides it for the worker
# (its metrics listener) and disables it for the one-shot migrate.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

ENTRYPOINT ["fencepost"]
CMD ["api", "--host", "0.0.0.0", "--port", "8000"]
