# cao — two commands for a fresh machine:
#   make demo   installs what is missing (tmux, a local .venv) and runs a multi-agent demo
#   make test   installs what is missing and runs the whole test suite (CI runs exactly this)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench lint docs screens tmux browser setup clean help

help:
	@echo "make demo    - install (tmux, .venv) and watch scripted agents coordinate through the inbox"
	@echo "make test    - install and run the whole test suite"
	@echo "make bench   - inbox benchmark (prints a table, writes bench-results/inbox.json)"
	@echo "make lint    - ruff and mypy"
	@echo "make docs    - regenerate docs/cli.md from --help"
	@echo "make screens - re-capture the real CLIs' screens (tests/screens) after a CLI update"

demo: setup
	$(BIN)/cao demo

test: setup browser
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m cao.bench

lint: setup
	$(BIN)/ruff check cao providers tests
	$(BIN)/ruff format --check cao providers tests
	$(BIN)/mypy

docs: setup
	$(BIN)/python -m cao.docgen > docs/cli.md

screens: setup
	$(BIN)/python -m tests.realcli.capture --out tests/screens

setup: tmux $(STAMP)

# Chromium for the dashboard's browser tests, from the system's package manager (Playwright drives
# it; nothing is downloaded at test time). Where it can't be installed those tests skip and say why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  echo "chromium not found; installing it from the system's packages for the dashboard tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  if command -v apt-get >/dev/null 2>&1; then ($$SUDO apt-get update -qq && $$SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "could not install chromium; the browser tests will skip"; \
	  else echo "no apt-get: install Chromium yourself to run the browser tests"; fi; }

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
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "$(PYTHON) not found; install Python 3.11+"; exit 1; }
	$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "cao needs Python 3.11+")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) bench-results .pytest_cache .mypy_cache .ruff_cache
