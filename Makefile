VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: install run test redis-server clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[engine,test]'
	touch $(STAMP)

install: $(STAMP)

redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server not found: installing it with apt-get"; \
	  (apt-get update -qq && apt-get install -y -qq redis-server) || \
	  { echo "could not install redis-server; install it with: sudo apt-get install redis-server"; exit 1; }; }

run: install redis-server
	$(VENV)/bin/stepwise up

test: install redis-server
	$(PY) -m pytest

clean:
	rm -rf $(VENV) var build *.egg-info
