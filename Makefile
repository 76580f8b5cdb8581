VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: install install-test run lint test redis-server chromium clean

# What running needs: torch (a CPU build from this pin) and the project with its engine extra.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==$(TORCH_VERSION)
	$(PIP) install --quiet -e '.[engine]'
	touch $(STAMP)

# What the tests need on top: pytest, moto, schemathesis, matplotlib ...
$(TEST_STAMP): $(STAMP) pyproject.toml
	$(PIP) install --quiet -e '.[engine,test]'
	touch $(TEST_STAMP)

install: $(STAMP)

install-test: $(TEST_STAMP)

redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server not found: installing it with apt-get"; \
	  (apt-get update -qq && apt-get install -y -qq redis-server) || \
	  { echo "could not install redis-server; install it with: sudo apt-get install redis-server"; exit 1; }; }

# Headless Chromium and its driver, for the web page's browser test (tests/api/test_web_page.py).
chromium:
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	  echo "chromium not found: installing chromium and chromium-driver with apt-get"; \
	  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) || \
	  { echo "could not install chromium; install it with: sudo apt-get install chromium chromium-driver"; exit 1; }; }

run: install redis-server
	$(VENV)/bin/stepwise up

# Lint, format and types (config in pyproject.toml): ruff over the tree, mypy over batching, storage and api.
lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint redis-server chromium
	$(PY) -m pytest

clean:
	rm -rf $(VENV) var build *.egg-info
