"""Keep Dockerfile, docker-compose.yml and .dockerignore honest without a Docker engine.

Every command line they run is parsed by the real `fencepost` argument parser;
every environment variable they set is a field of `Settings` (or one of a few
named non-settings) and every value they set validates; the workflow modules they
name import and register workflows from the folder compose mounts; and the
Dockerfile's build recipe (only what it COPYs from the context, a wheel, the
migrations beside the installed package) is replayed in a temporary directory.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from fnmatch import fnmatch
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app.cli import build_parser
from app.registry import load_workflows
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERIGNORE = ROOT / ".dockerignore"

# Environment variables that are not fencepost settings but may be set.
IMAGE_NON_SETTINGS = {"PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
                      "PIP_CONSTRAINT", "PIP_DISABLE_PIP_VERSION_CHECK"}
POSTGRES_SERVICE = "postgres"
ROLES_SERVICE = "roles"
FENCEPOST_ROLES = ("migrate", "api", "worker")
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|cc|clang|make|build-essential|libc6-dev|libpq-dev|apt-get\s+install|apk\s+add"
    r"|pip\s+install|pip\s+wheel)\b"
)


# ------------------------------------------------------------------ Dockerfile


@dataclass
class Instruction:
    keyword: str
    args: str


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def _logical_lines(text: str) -> list[str]:
    """Dockerfile lines with `\\` continuations joined and comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue  # comments (also inside continuations) and blank lines
        if stripped.endswith("\\"):
            current += stripped[:-1].rstrip() + " "
            continue
        current += stripped
        if current.strip():
            lines.append(current.strip())
        current = ""
    assert not current, "the Dockerfile ends inside a line continuation"
    return lines


def _substitute(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), value)


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            words = rest.split()
            words = [w for w in words if not w.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(_substitute(words[0], global_args), name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede the first FROM, found {keyword}"
            key, _, default = rest.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, rest))
    return global_args, stages


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def env_names(instruction: Instruction) -> dict[str, str]:
    words = shlex.split(instruction.args)
    if words and "=" not in words[0]:  # legacy `ENV KEY value`
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words)


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final_stage(dockerfile) -> Stage:
    return dockerfile[1][-1]


def image_env(final_stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in final_stage.all("ENV"):
        env.update(env_names(instruction))
    return env


def test_dockerfile_is_multi_stage_with_a_slim_final_stage(dockerfile):
    _, stages = dockerfile
    assert len(stages) >= 2, "the Dockerfile must build in one stage and run in another"
    builder, final = stages[0], stages[-1]
    # Pinned: a full Python version and the Debian release, never a moving tag.
    assert re.fullmatch(r"python:3\.1[1-9]\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?",
                        final.image), final.image
    # The venv is copied across stages: its interpreter symlinks need the same base.
    assert builder.image == final.image
    copies = [c.args for c in final.all("COPY") if c.args.startswith("--from=")]
    assert copies, "the final stage must take its venv from the builder stage"
    assert all(c.startswith(f"--from={builder.name} ") for c in copies)


def test_final_stage_installs_no_build_tools(final_stage):
    for run in final_stage.all("RUN"):
        found = BUILD_TOOLS.search(run.args)
        assert found is None, f"final stage installs or uses {found[0]!r}: RUN {run.args}"


def test_no_stage_installs_the_embedded_extra(dockerfile):
    _, stages = dockerfile
    for stage in stages:
        for instruction in stage.instructions:
            assert "embedded" not in instruction.args and "pgserver" not in instruction.args
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # The builder installs [project].dependencies: the embedded Postgres must stay an extra.
    assert not any(d.startswith("pgserver") for d in project["dependencies"])


def test_every_pip_install_in_the_build_is_pinned_by_the_lock_file(dockerfile):
    """Dependency versions are pinned: the builder copies constraints.txt and
    every pip run (install, and wheel with its isolated build backend) is
    constrained by it (PIP_CONSTRAINT or -c)."""
    _, stages = dockerfile
    builder = stages[0]
    assert "constraints.txt" in _build_context_sources(stages)
    env = {}
    for instruction in builder.all("ENV"):
        env.update(env_names(instruction))
    constrained_by_env = env.get("PIP_CONSTRAINT", "").endswith("constraints.txt")
    pip_runs = 0
    for run in builder.all("RUN"):
        for command in re.split(r"&&|;", run.args):
            if not re.search(r"\bpip\s+(install|wheel)\b", command):
                continue
            pip_runs += 1
            assert constrained_by_env or re.search(
                r"(-c|--constraint)\s+\S*constraints\.txt|PIP_CONSTRAINT=\S*constraints\.txt",
                command), f"pip runs without the lock file: {command.strip()}"
            assert "--upgrade pip" not in command or constrained_by_env or "-c" in command
    assert pip_runs >= 3, "expected pip install (pip, dependencies, wheel) in the builder"


def test_final_stage_runs_as_a_non_root_user(final_stage):
    users = final_stage.all("USER")
    assert users, "the final stage must switch to a non-root USER"
    user = users[-1].args.split(":")[0]
    assert user not in {"root", "0"}
    # The account exists (created in this stage) under the id or name USER gives.
    created = " ".join(r.args for r in final_stage.all("RUN"))
    account = rf"--uid {user}\b" if user.isdigit() else rf"useradd [^&;]*\b{user}\s*(&&|;|$)"
    assert "useradd" in created and re.search(account, created), created


def test_entrypoint_is_the_console_script_and_cmd_parses(final_stage):
    (entrypoint,) = final_stage.all("ENTRYPOINT")
    (cmd,) = final_stage.all("CMD")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert exec_form(entrypoint.args) == ["fencepost"]
    assert scripts["fencepost"] == "app.cli:main"
    args = parse_cli(exec_form(cmd.args))
    assert args.command == "api" and args.host == "0.0.0.0"


def test_healthcheck_hits_healthz_on_the_api_port(final_stage):
    (check,) = final_stage.all("HEALTHCHECK")
    options, _, command = check.args.partition("CMD ")
    argv = exec_form(command)
    assert argv[:2] == ["python", "-c"], "slim has no curl: check with python's urllib"
    compile(argv[2], "<healthcheck>", "exec")
    url = re.search(r"http://127\.0\.0\.1:(\d+)/healthz", argv[2])
    assert url, argv[2]
    (cmd,) = final_stage.all("CMD")
    assert int(url[1]) == parse_cli(exec_form(cmd.args)).port
    assert "--timeout=" in options


def test_dockerfile_environment_names_settings_or_known_variables(dockerfile):
    _, stages = dockerfile
    for stage in stages:
        for instruction in stage.all("ENV"):
            for name in env_names(instruction):
                assert name in IMAGE_NON_SETTINGS or is_setting(name), f"ENV {name} is no setting"


def test_image_expects_migrations_beside_the_installed_package(dockerfile):
    _, stages = dockerfile
    builder = stages[0]
    runs = " ".join(r.args for r in builder.all("RUN"))
    assert re.search(r"cp -r migrations\b", runs), "migrations/ must be copied beside `app`"
    assert "head_revision" in runs, "the build must prove the installed code finds migrations/"
    final_runs = " ".join(r.args for r in stages[-1].all("RUN"))
    assert "head_revision" in final_runs


def _build_context_sources(stages: list[Stage]) -> list[str]:
    sources: list[str] = []
    for stage in stages:
        for copy in stage.all("COPY") + stage.all("ADD"):
            if copy.args.startswith("--from="):
                continue
            words = [w for w in shlex.split(copy.args) if not w.startswith("--")]
            sources += words[:-1]
    return sources


def test_every_copied_source_exists_and_is_in_the_build_context(dockerfile):
    _, stages = dockerfile
    sources = _build_context_sources(stages)
    assert {"pyproject.toml", "app", "migrations", "constraints.txt"} <= set(sources)
    patterns = [p.strip() for p in DOCKERIGNORE.read_text().splitlines()]
    patterns = [p for p in patterns if p and not p.startswith("#")]
    for source in sources:
        path = ROOT / source
        assert path.exists(), f"COPY {source}: no such file in the repository"
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            if "__pycache__" in rel:
                continue
            assert not dockerignored(rel, patterns), f"{rel} is needed but .dockerignore drops it"
    for secret_or_bulk in [".git/HEAD", ".venv/bin/python", ".env", "tests/conftest.py"]:
        assert dockerignored(secret_or_bulk, patterns), f"{secret_or_bulk} would enter the context"


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified: the last pattern matching the path or a parent wins."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if any(fnmatch(c, pattern) for c in candidates):
            excluded = not negate
    return excluded


def test_build_recipe_replayed_finds_migrations_from_the_installed_wheel(dockerfile, tmp_path):
    """Copy only what the Dockerfile COPYs, build the wheel, lay it out as installed,
    put migrations/ beside it as the builder does, and import it from elsewhere."""
    _, stages = dockerfile
    src = tmp_path / "src"
    src.mkdir()
    for source in _build_context_sources(stages):
        origin = ROOT / source
        if origin.is_dir():
            _copy_tree(origin, src / source)
        else:
            (src / source).write_bytes(origin.read_bytes())
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
         str(tmp_path / "wheels"), str(src)],
        capture_output=True, text=True, timeout=240,
    )
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    (wheel,) = (tmp_path / "wheels").glob("fencepost-*.whl")
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(site)
    # Everything under app/ (code and any data file) must be in the wheel.
    for f in (ROOT / "app").rglob("*"):
        rel = f.relative_to(ROOT).as_posix()
        if f.is_file() and "__pycache__" not in rel and not rel.endswith(".pyc"):
            assert rel in names, (
                f"{rel} is missing from the wheel the image installs: "
                "add it to [tool.setuptools.package-data] in pyproject.toml"
            )
    _copy_tree(src / "migrations", site / "migrations")
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import app, app.cli; from app.migrate import MIGRATIONS, head_revision;"
        "assert app.__file__.startswith(sys.argv[1]), app.__file__;"
        "sys.modules['pgserver'] = None;"  # the image has no embedded extra
        "app.cli.build_parser();"
        "print(MIGRATIONS, head_revision())"
    )
    ran = subprocess.run([sys.executable, "-c", probe, str(site)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    migrations_dir, head = ran.stdout.split()
    assert Path(migrations_dir) == site / "migrations"
    from app.migrate import head_revision

    assert head == head_revision()


def _installed_closure(requirements: list[str]) -> set[str]:
    """Distributions pip installs for `requirements` (as far as this venv knows them)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    stack = [(Requirement(r), frozenset({""})) for r in requirements]
    while stack:
        req, parent_extras = stack.pop()
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in parent_extras):
            continue
        name = canonicalize_name(req.name)
        extras = frozenset(req.extras) | {""}
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        names.add(name)
        try:
            children = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        stack += [(Requirement(c), extras) for c in children]
    return names


def test_image_dependencies_cover_every_import_of_the_app():
    """The builder installs only [project].dependencies: everything `app` imports
    must come from them (directly or through them), or the image fails at run time."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = _installed_closure(project["dependencies"])
    # Only `fencepost dev` uses the embedded extra, and it imports it lazily.
    embedded = _installed_closure(project["optional-dependencies"].get("embedded", []))
    providers = metadata.packages_distributions()
    missing = []
    for source in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in {"app", "__future__"}:
                    continue
                dists = {canonicalize_name(d) for d in providers.get(top, [])}
                if not dists & (installed | embedded):
                    missing.append(f"{source.relative_to(ROOT)} imports {top} ({', '.join(dists)})")
    assert not missing, (
        "not installed in the image; add to [project].dependencies:\n" + "\n".join(missing)
    )


def _copy_tree(origin: Path, target: Path) -> None:
    for f in origin.rglob("*"):
        if f.is_file() and "__pycache__" not in f.parts:
            dest = target / f.relative_to(origin)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.read_bytes())


# ------------------------------------------------------------------ compose


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def parse_cli(argv: list[str]):
    parser = build_parser()
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"`fencepost {' '.join(argv)}` is not a valid command line (exit {exc.code})")


def is_setting(name: str) -> bool:
    fields = Settings.model_fields
    for key, info in fields.items():
        alias = info.validation_alias
        aliases = getattr(alias, "choices", [alias]) if alias else []
        if name in aliases:
            return True
        if not aliases and name == "FENCEPOST_" + key.upper():
            return True
    return False


# What an operator sets before `docker compose up` (compose refuses to start without).
REQUIRED_VARIABLES = {
    "POSTGRES_PASSWORD": "superuser-secret",
    "MIGRATOR_PASSWORD": "migrator-secret",
    "RUNTIME_PASSWORD": "runtime-secret",
}
MIGRATOR, RUNTIME = "fencepost_migrator", "fencepost_runtime"


def interpolate(value: str, given: dict[str, str] | None = None) -> str:
    """Compose's ${VAR:-default} / ${VAR-default} / ${VAR:?error} / ${VAR}, with
    the operator's REQUIRED_VARIABLES set and nothing else in the environment."""
    given = REQUIRED_VARIABLES if given is None else given

    def one(m: re.Match) -> str:
        name, op, arg = m[1], m[2] or "", m[3] or ""
        if name in given:
            return given[name]
        if op.endswith("?"):
            raise LookupError(f"compose refuses to start: {name} is not set ({arg})")
        return arg

    return re.sub(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}", one, str(value))


def environment(service: dict, given: dict[str, str] | None = None) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: interpolate(v, given) for k, v in env.items()}


def test_compose_has_postgres_migrate_api_and_worker(services):
    assert {POSTGRES_SERVICE, ROLES_SERVICE, *FENCEPOST_ROLES} <= set(services)


def test_images_are_parameters_with_the_official_defaults(services, dockerfile):
    """One file for users (official images) and for machines without a registry:
    POSTGRES_IMAGE picks the Postgres image, PYTHON_IMAGE is passed to the build (unset,
    the Dockerfile's default applies), and the Dockerfile needs no frontend image."""
    for name in (POSTGRES_SERVICE, ROLES_SERVICE):
        image = services[name]["image"]
        assert image.startswith("${POSTGRES_IMAGE:-"), image
        assert interpolate(image, {**REQUIRED_VARIABLES, "POSTGRES_IMAGE": "local/pg:15"}) == (
            "local/pg:15")
    for role in FENCEPOST_ROLES:
        build = services[role]["build"]
        assert build["args"] == ["PYTHON_IMAGE"], "the value comes from the environment, if set"
    global_args, stages = dockerfile
    assert "PYTHON_IMAGE" in global_args and stages[0].image == stages[-1].image
    assert not DOCKERFILE.read_text().startswith("# syntax="), (
        "a syntax directive makes BuildKit pull a frontend image; the legacy builder must work"
    )


def test_postgres_is_16_on_a_named_volume_with_a_healthcheck(compose, services):
    pg = services[POSTGRES_SERVICE]
    # Pinned: a minor release and the Debian release, not the moving `16`.
    image = interpolate(pg["image"])
    assert re.fullmatch(r"postgres:16\.\d+-[a-z]+(@sha256:[0-9a-f]{64})?", image), image
    named = set(compose.get("volumes") or {})
    data_mounts = [str(v) for v in pg.get("volumes", []) if "/var/lib/postgresql" in str(v)]
    assert data_mounts, "Postgres data must live on a volume"
    assert all(v.split(":")[0] in named for v in data_mounts), f"not a named volume: {data_mounts}"
    test = pg["healthcheck"]["test"]
    assert "pg_isready" in (test if isinstance(test, str) else " ".join(test))


def test_every_fencepost_service_uses_the_one_image(services, dockerfile):
    images = {services[r].get("image") for r in FENCEPOST_ROLES}
    assert len(images) == 1
    for role in FENCEPOST_ROLES:
        build = services[role].get("build")
        if build is not None:
            context = build if isinstance(build, str) else build.get("context", ".")
            dockerfile_name = "Dockerfile" if isinstance(build, str) else build.get(
                "dockerfile", "Dockerfile")
            assert (ROOT / context / dockerfile_name).resolve() == DOCKERFILE
        assert "entrypoint" not in services[role], "roles differ by command, not entrypoint"


@pytest.mark.parametrize("role", FENCEPOST_ROLES)
def test_every_compose_command_parses_with_the_cli(services, role, final_stage):
    command = services[role].get("command")
    if command is None:  # the image's CMD
        (cmd,) = final_stage.all("CMD")
        command = exec_form(cmd.args)
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    args = parse_cli(argv)
    assert args.command == role


def test_migrate_is_a_one_shot_that_api_and_worker_wait_for(services):
    migrate = services["migrate"]
    assert migrate.get("restart", "no") in {"no", False}, "a one-shot must not be restarted"
    assert migrate["depends_on"][ROLES_SERVICE]["condition"] == "service_completed_successfully"
    assert services[ROLES_SERVICE]["depends_on"][POSTGRES_SERVICE]["condition"] == (
        "service_healthy")
    assert services[ROLES_SERVICE].get("restart") in {"no", False}
    for role in ("api", "worker"):
        assert services[role]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        ), role


def test_worker_runs_two_replicas_and_drains_before_it_is_killed(services, monkeypatch):
    worker = services["worker"]
    assert worker["deploy"]["replicas"] == 2
    assert "container_name" not in worker and "ports" not in worker, "replicas would collide"
    grace = _seconds(worker.get("stop_grace_period", "10s"))
    _use_environment(monkeypatch, environment(worker))
    assert grace > Settings().shutdown_grace_seconds, (
        "stop_grace_period must outlast FENCEPOST_SHUTDOWN_GRACE_SECONDS, "
        "or docker SIGKILLs workers mid-drain"
    )


def _seconds(duration: str | int) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(duration))
    assert parts, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_api_publishes_its_port_and_roles_without_http_override_the_healthcheck(services):
    api_args = parse_cli(services["api"]["command"])
    assert any(str(p).split(":")[-1] == str(api_args.port) for p in services["api"]["ports"])
    assert "healthcheck" not in services["api"], "the image's HEALTHCHECK (/healthz) applies"
    assert services["migrate"]["healthcheck"].get("disable") is True
    worker_args = parse_cli(services["worker"]["command"])
    assert worker_args.metrics_port and worker_args.metrics_host in {"0.0.0.0", "127.0.0.1"}
    check = " ".join(services["worker"]["healthcheck"]["test"])
    assert f"http://127.0.0.1:{worker_args.metrics_port}/" in check


@pytest.mark.parametrize("role", [POSTGRES_SERVICE, *FENCEPOST_ROLES])
def test_compose_environment_names_settings_or_known_variables(services, role):
    for name in environment(services[role]):
        if role == POSTGRES_SERVICE:
            assert name.startswith("POSTGRES_") or name == "PGDATA", name
        else:
            assert name in IMAGE_NON_SETTINGS or is_setting(name), (
                f"{role}: {name} is not a fencepost setting (app/settings.py)"
            )


@pytest.mark.parametrize("role", FENCEPOST_ROLES)
def test_compose_environment_values_validate(services, role, monkeypatch):
    env = environment(services[role])
    _use_environment(monkeypatch, env)
    settings = Settings()
    assert settings.database_url
    pg_env = environment(services[POSTGRES_SERVICE])
    roles_env = environment(services[ROLES_SERVICE])
    # migrate connects as the schema's owner, api and worker as the runtime role;
    # none of them as the superuser.
    user, password = (MIGRATOR, roles_env["MIGRATOR_PASSWORD"]) if role == "migrate" \
        else (RUNTIME, roles_env["RUNTIME_PASSWORD"])
    assert settings.database_url == (
        f"postgresql://{user}:{password}@{POSTGRES_SERVICE}:5432/{pg_env['POSTGRES_DB']}"
    )
    assert user != pg_env["POSTGRES_USER"]
    if "FENCEPOST_AUTH" in env:
        assert settings.auth == "enabled"


def _use_environment(monkeypatch, env: dict[str, str]) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("FENCEPOST_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def _mounts(service: dict) -> list[tuple[str, str, str]]:
    """(source, target, mode) of each volume, with the variables at their defaults."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target, *mode = interpolate(str(volume)).split(":")
        mounts.append((source, target, mode[0] if mode else "rw"))
    return mounts


@pytest.mark.parametrize("role", ("api", "worker"))
def test_workflow_modules_import_from_the_mounted_folder_and_register(
        services, role, final_stage, monkeypatch):
    service = services[role]
    pythonpath = image_env(final_stage)["PYTHONPATH"].split(":")
    mounted = [(s, t, m) for s, t, m in _mounts(service) if t in pythonpath]
    assert mounted, f"{role}: no folder mounted on the image's PYTHONPATH {pythonpath}"
    for source, _target, mode in mounted:
        assert source.startswith("./") and (ROOT / source).is_dir(), source
        assert mode == "ro", "workflow code is mounted read-only"
        monkeypatch.syspath_prepend(str(ROOT / source))

    modules = Settings(workflows=environment(service)["FENCEPOST_WORKFLOWS"]).workflow_modules
    assert "app.examples" in modules and len(modules) >= 2, modules
    for module in modules:
        registered = load_workflows([module])
        assert registered, f"{module} registers no workflow"
        if not module.startswith("app."):
            file = Path(sys.modules[module].__file__).resolve()
            assert any(file.is_relative_to((ROOT / s).resolve()) for s, _, _ in mounted), (
                f"{module} was imported from {file}, not from the mounted folder"
            )
    assert {"welcome-customer", "charge-order"} <= set(load_workflows(modules))


def test_every_fencepost_service_loads_the_same_workflows(services):
    values = {environment(services[r]).get("FENCEPOST_WORKFLOWS") for r in ("api", "worker")}
    assert len(values) == 1, "API and workers must load the same workflow modules"


# ------------------------------------------------------------------ least privilege


def test_compose_has_no_default_password_and_refuses_to_start_without_one(services):
    """Every password comes from a variable compose requires (${VAR:?message}),
    none has a default; with any one unset, no service's environment resolves."""
    text = COMPOSE.read_text()
    for match in re.finditer(r"\$\{(\w*PASSWORD\w*)([^}]*)\}", text):
        name, rest = match[1], match[2]
        assert rest.startswith(":?"), f"${{{name}{rest}}}: a password must be required, not defaulted"
    used = set(re.findall(r"\$\{(\w+)", text))
    assert set(REQUIRED_VARIABLES) <= used, used
    for missing in REQUIRED_VARIABLES:
        given = {k: v for k, v in REQUIRED_VARIABLES.items() if k != missing}
        refused = []
        for name, service in services.items():
            try:
                environment(service, given)
            except LookupError:
                refused.append(name)
        assert refused, f"with {missing} unset compose would still start"
    # No literal password anywhere in a URL or a POSTGRES_PASSWORD.
    assert not re.search(r"postgresql://\w+:(?!\$\{)[^@]+@", text)
    assert not re.search(r"^\s*POSTGRES_PASSWORD:\s+(?!\$\{)\S", text, re.MULTILINE)


def test_the_api_port_is_published_on_loopback_only(services):
    for role, service in services.items():
        for port in service.get("ports", []):
            spec = str(port)
            assert spec.startswith("127.0.0.1:"), f"{role} publishes {spec} on every interface"
    assert services["api"]["ports"], "the API must be reachable from the host"
    assert "ports" not in services[POSTGRES_SERVICE]


def test_the_roles_one_shot_runs_the_role_script_before_migrate(services):
    """Any Postgres image (and a volume set up before the roles existed) gets the two
    roles: the one shot connects over the network as the superuser and runs roles.sql
    in one transaction when they are missing (tests/containers runs it for real)."""
    roles = services[ROLES_SERVICE]
    assert roles["image"] == services[POSTGRES_SERVICE]["image"], "psql comes with that image"
    mounts = {target: (source, mode) for source, target, mode in _mounts(roles)}
    entrypoint = roles["entrypoint"]
    assert entrypoint[0] == "sh", entrypoint
    script_target = PurePosixPath(entrypoint[1])
    source, mode = mounts[str(script_target.parent)]
    assert mode == "ro" and (ROOT / source).resolve() == ROOT / "deploy/postgres"
    script = (ROOT / source / script_target.name).read_text()
    assert (ROOT / source / "roles.sql").is_file() and '-f "$here/roles.sql"' in script
    assert "psql -1 -v ON_ERROR_STOP=1" in script and "set -eu" in script
    # The roles the compose URLs name are the ones the script creates.
    assert f"migrator={MIGRATOR}" in script and f"runtime={RUNTIME}" in script
    env = environment(roles)
    assert env["PGHOST"] == POSTGRES_SERVICE and env["PGUSER"] == "postgres"
    assert env["PGPASSWORD"] == REQUIRED_VARIABLES["POSTGRES_PASSWORD"]
    assert env["PGDATABASE"] == environment(services[POSTGRES_SERVICE])["POSTGRES_DB"]
    for variable in ("MIGRATOR_PASSWORD", "RUNTIME_PASSWORD"):
        assert f'"${variable}"' in script
        assert env[variable] == REQUIRED_VARIABLES[variable]


def test_role_script_grants_the_runtime_role_data_rights_only():
    """The grants, statement by statement (tests/tenancy/test_deployment_roles.py
    runs the script on a real Postgres)."""
    sql = re.sub(r"--[^\n]*", "", (ROOT / "deploy/postgres/roles.sql").read_text())
    statements = [" ".join(s.split()) for s in sql.split(";") if s.strip()]
    expected = [
        'CREATE ROLE :"migrator" LOGIN PASSWORD :\'migrator_password\'',
        'CREATE ROLE :"runtime" LOGIN PASSWORD :\'runtime_password\'',
        'REVOKE ALL ON DATABASE :"database" FROM PUBLIC',
        'GRANT CONNECT ON DATABASE :"database" TO :"migrator", :"runtime"',
        'ALTER SCHEMA public OWNER TO :"migrator"',
        'REVOKE ALL ON SCHEMA public FROM PUBLIC',
        'GRANT USAGE ON SCHEMA public TO :"runtime"',
        'ALTER DEFAULT PRIVILEGES FOR ROLE :"migrator" IN SCHEMA public '
        'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"runtime"',
        'ALTER DEFAULT PRIVILEGES FOR ROLE :"migrator" IN SCHEMA public '
        'GRANT USAGE, SELECT ON SEQUENCES TO :"runtime"',
    ]
    for statement in expected:
        assert statement in statements, f"roles.sql lacks: {statement}"
    runtime_grants = [s for s in statements if re.search(r'TO :"runtime"', s)]
    for statement in runtime_grants:
        assert not re.search(r"\b(CREATE|TRUNCATE|REFERENCES|TRIGGER|ALL)\b(?! ROLE)",
                             statement.split(" TO ")[0].replace("CREATE ROLE", "")), statement
    assert not any("SUPERUSER" in s or "CREATEDB" in s or "CREATEROLE" in s for s in statements)


def test_the_image_tag_is_the_project_version(services):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for role in FENCEPOST_ROLES:
        image = interpolate(services[role]["image"])
        assert image == f"fencepost:{version}", image
