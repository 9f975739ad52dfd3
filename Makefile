# cao — two commands for a fresh machine:
#   make demo   installs what is missing (tmux, a local .venv) and runs a multi-agent demo
#   make test   installs what is missing and runs the whole test suite (CI runs exactly this)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast test-integration test-realcli test-browser test-postgresql prepare bench lint \
	docs screens tmux setup clean help

help:
	@echo "make demo    - install (tmux, .venv) and watch scripted agents coordinate through the inbox"
	@echo "make test    - install what the tests need, then run the whole suite (every tier)"
	@echo "make test-fast | test-integration | test-realcli | test-browser - one tier (docs/testing.md)"
	@echo "make test-postgresql - the integration tier with every store on PostgreSQL (docs/multi-host.md)"
	@echo "make prepare - only install what the tests need (TIERS='realcli browser' for some)"
	@echo "make bench   - inbox benchmark (prints a table, writes bench-results/inbox.json); BENCH_ARGS=--multi-host: two hosts on PostgreSQL"
	@echo "make lint    - ruff and mypy"
	@echo "make docs    - regenerate docs/cli.md from --help and docs/providers.md's knob table"
	@echo "make screens - re-capture the real CLIs' screens (tests/screens) after a CLI update"

demo: setup
	$(BIN)/cao demo

# The suite in four tiers (tests/conftest.py marks each test; docs/testing.md has their times).
# What a tier needs is installed first, as its own step (tests/prepare.py): no test downloads.
test: setup
	@echo "== make test: installing what the tests need (Chromium, the agent CLIs, the reference clients)"
	$(BIN)/python -m tests.prepare
	@echo "== make test: the tests, tier by tier (fast, integration, realcli, browser)"
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m fast

# the integration tier again, every cao-server and store on a PostgreSQL server it starts
test-postgresql: setup
	$(BIN)/python -m tests.prepare integration
	CAO_TEST_DATABASE=postgresql $(BIN)/python -m pytest -q -m integration

test-integration test-realcli test-browser: test-%: setup
	$(BIN)/python -m tests.prepare $*
	$(BIN)/python -m pytest -q -m $*

prepare: setup
	$(BIN)/python -m tests.prepare $(TIERS)

bench: setup
	$(BIN)/python -m cao.bench $(BENCH_ARGS)

lint: setup
	$(BIN)/ruff check cao providers tests
	$(BIN)/ruff format --check cao providers tests
	$(BIN)/mypy

docs: setup
	$(BIN)/python -m cao.docgen > docs/cli.md
	$(BIN)/python -m cao.docgen --knobs docs/providers.md

screens: setup
	$(BIN)/python -m tests.realcli.capture --out tests/screens

setup: tmux $(STAMP)

# tmux from the system's package manager when it is missing (root or passwordless sudo).
tmux:
	@command -v tmux >/dev/null 2>&1 || { \
	  echo "tmux not found; installing it"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  if command -v apt-get >/dev/null 2>&1; then $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq tmux; \
	  elif command -v dnf >/dev/null 2>&1; then $$SUDO dnf install -y tmux; \
	  elif command -v brew >/dev/null 2>&1; then brew install tmux; \
	  else echo "please install tmux (https://github.com/tmux/tmux/wiki/Installing)"; exit 1; fi; }

$(STAMP): pyproject.toml
	@echo "== setup: tmux and the project's .venv (pip install -e '.[dev]')"
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "$(PYTHON) not found; install Python 3.11+"; exit 1; }
	$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "cao needs Python 3.11+")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) bench-results .pytest_cache .mypy_cache .ruff_cache
