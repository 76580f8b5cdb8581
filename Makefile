VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION := 2.13.0
# Which PyTorch build `make install` puts in the venv. The plain pin takes what pip finds for it: from PyPI
# on Linux x86-64 that is the CUDA build (several GB; it runs on a CPU too), on macOS and Windows a CPU
# build, and where a local wheel stands in for the pin (these machines, CI) that wheel. For PyTorch's
# CPU-only Linux build (about 200 MB):
#     make run TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# or another CUDA version: TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 (pytorch.org lists them).
TORCH_SPEC ?= torch==$(TORCH_VERSION)
TORCH_INDEX_URL ?=
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# pip quietly (no "new version of pip" notice, no setuptools notice that an editable install reads this folder) and
# without byte-compiling every module it unpacks (about 70 CPU-seconds, most of it torch modules nothing imports):
# Python compiles what is imported on first use, and $(WARM_IMPORTS) does that once for what every process imports.
comma := ,
QUIET_PIP := PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONWARNINGS=ignore::UserWarning $(PIP) install --quiet --no-compile
IMPORT_ONCE := PYTHONDONTWRITEBYTECODE= PYTHONWARNINGS=ignore TRANSFORMERS_VERBOSITY=error $(PY) -c
WARM_IMPORTS := $(IMPORT_ONCE) \
	"import stepwise_cli.main, worker.app, api, peft, boto3; from diffusers import StableDiffusionPipeline, WanPipeline"
# and what the test processes import on top, so that four pytest-xdist workers do not each compile it at once
WARM_TEST_IMPORTS := $(IMPORT_ONCE) \
	"import pytest, xdist, moto.server, schemathesis, hypothesis, openai, matplotlib.pyplot, selenium.webdriver, httpx"

.PHONY: install install-test run style lint test redis-server chromium clean

# The venv with torch ($(TORCH_SPEC), see above) and the project with the extras $(1), in one pip resolve.
define install_venv
	@echo "make: installing $(TORCH_SPEC)$(if $(TORCH_INDEX_URL), from $(TORCH_INDEX_URL)) and stepwise[$(1)] into $(VENV)"
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(QUIET_PIP) --upgrade pip
	@$(QUIET_PIP) $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) '$(TORCH_SPEC)'
	@$(QUIET_PIP) -e '.[$(1)]'
	@$(WARM_IMPORTS)
endef

# What running needs: torch and the project with its engine extra.
$(STAMP): pyproject.toml
	$(call install_venv,engine)
	@touch $(STAMP)

# What the tests need on top (pytest, moto, schemathesis, matplotlib ...): installed with the rest in one go on a
# fresh clone, which also makes $(STAMP) current.
$(TEST_STAMP): pyproject.toml
	$(call install_venv,engine$(comma)test)
	@$(WARM_TEST_IMPORTS)
	@touch $(STAMP) $(TEST_STAMP)

install: $(STAMP)

install-test: $(TEST_STAMP)

redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "redis-server not found: installing it with apt-get"; \
	  (apt-get update -qq && apt-get install -y -qq redis-server) || \
	  { echo "could not install redis-server; install it with: sudo apt-get install redis-server"; exit 1; }; }

# Headless Chromium and its driver, for the web page's browser tests (tests/api/test_web_page*.py): without the
# packages Debian only recommends (126 packages, systemd and avahi among them: 3 minutes on a fresh machine, against
# 20 packages in 17 s), with the fonts the page is laid out in.
chromium:
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	  echo "chromium not found: installing chromium and chromium-driver with apt-get"; \
	  (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-liberation) || \
	  { echo "could not install chromium; install it with: sudo apt-get install chromium chromium-driver"; exit 1; }; }

# `make run PORT=8080` puts the API on another port (so does STEPWISE_API_PORT=8080); by default 8000.
run: install redis-server
	@$(VENV)/bin/stepwise up$(if $(PORT), --port $(PORT))

# Lint and format (ruff over the tree), then types (mypy over every package); config in pyproject.toml.
style: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

lint: style
	$(VENV)/bin/mypy

# The suite in parallel (docs/testing.md): TEST_WORKERS pytest-xdist workers, each test file (or xdist_group) a
# unit, after ruff; mypy checks types beside the tests (its minute overlaps their waiting), its report printed
# after theirs, and either failing fails `make test`. PYTHONDONTWRITEBYTECODE is cleared so the many processes
# the tests start share compiled modules.
TEST_WORKERS ?= 4
PYTEST_ARGS ?=
test: style redis-server chromium
	@$(VENV)/bin/mypy > $(VENV)/mypy.log 2>&1 & mypy=$$!; \
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); tests=$$?; \
	wait $$mypy; types=$$?; echo "mypy:"; cat $(VENV)/mypy.log; [ $$tests -eq 0 ] && [ $$types -eq 0 ]

clean:
	rm -rf $(VENV) var build *.egg-info
