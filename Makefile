# fencepost developer entry points. `make test` is what CI runs (.ci/run): lint
# and types first (`make lint` alone takes seconds), then the whole suite, then its
# Citus variant (`make test-citus`).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv browser node promtool test test-citus lint dev clean-venv

venv: $(STAMP)

# Reinstall only when pyproject.toml or constraints.txt is newer than the stamp.
# The runtime dependencies at the versions constraints.txt pins (what the image
# ships), so the tests run with exactly those; a registry offering newer ones
# changes nothing until the file is regenerated (tests/deploy/test_lock_file.py).
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,embedded]'
	touch $(STAMP)

# Debian's Chromium for the dashboard's browser tests (tests/ui); CI runs as root.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

# Node.js and npm for the generated TypeScript client's test (tests/client); CI runs as root.
node:
	@command -v npm >/dev/null 2>&1 || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nodejs npm >/dev/null; }

# Debian's Prometheus for promtool: tests/maintenance/test_prometheus.py checks the
# alert rules (deploy/prometheus), runs their unit tests and lints live /metrics.
# Where no init system runs (these machines, CI) its server is installed, not started.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    prometheus >/dev/null; }

test: venv lint browser node promtool
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-citus

# The tests marked `citus` again, on the Citus cluster whose coordinator is
# TEST_CITUS_URL (.ci/run starts one with ../shared/citus). Without it the variant
# does not run, and says so loudly (CITUS_SKIPPED, set by .ci/run, says why) but
# does not fail: a machine with no cluster still runs the plain suite.
test-citus: venv
	@if [ -z "$${TEST_CITUS_URL:-}" ]; then \
	  echo "==================== Citus variant SKIPPED: $${CITUS_SKIPPED:-TEST_CITUS_URL is not set (the coordinator of a Citus cluster; .ci/run starts one)} ====================" >&2; \
	else \
	  FENCEPOST_TEST_POSTGRES=citus $(BIN)/python -m pytest -q -m citus $(PYTEST_ARGS); \
	fi

# ruff, then mypy over the whole app package (configuration in pyproject.toml);
# either one's findings fail the target.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy app

dev: venv
	$(BIN)/fencepost dev

clean-venv:
	rm -rf $(VENV)
