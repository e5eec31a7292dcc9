# Two entry points a fresh machine needs: `make demo` and `make test`.
# Both bootstrap their own virtual environment in .venv from nothing.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# Applications the Kafka acceptance tests run on top of levelzero (Quix Streams, Faust), in a
# virtual environment of their own: their pins clash with the suite's (tests/apps/requirements.txt).
APPS_VENV := .venv-apps
APPS_STAMP := $(APPS_VENV)/.installed
# Benchmark results are output, not source: written outside the tree unless told otherwise.
BENCH_OUT ?= $(HOME)/.cache/levelzero/bench/results.json

.PHONY: demo test lint bench lock clean

# constraints.txt pins every package to the version CI tested (regenerate with `make lock`).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c constraints.txt -e '.[test,analysis]'
	touch $(STAMP)

$(APPS_STAMP): tests/apps/requirements.txt
	$(PYTHON) -m venv $(APPS_VENV)
	$(APPS_VENV)/bin/pip install --quiet --upgrade pip
	$(APPS_VENV)/bin/pip install --quiet -r tests/apps/requirements.txt
	touch $(APPS_STAMP)

demo: $(STAMP)
	$(VENV)/bin/levelzero demo

# The linter and the type checker run first: a finding fails the build (their scope and rules
# are in pyproject.toml).
test: lint $(APPS_STAMP)
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

# The formatter checks the layout of the code (`ruff format levelzero tests` rewrites it).
lint: $(STAMP)
	$(VENV)/bin/ruff check
	$(VENV)/bin/ruff format --check levelzero tests
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(VENV)/bin/levelzero bench --out $(BENCH_OUT)

lock: $(STAMP)
	{ echo "# Exact versions \`make test\` installs (pip install -c constraints.txt), so CI is reproducible."; \
	  echo "# Regenerate after changing dependencies: make lock"; \
	  $(VENV)/bin/pip freeze --all --exclude-editable | grep -v '^pip=='; } > constraints.txt

clean:
	rm -rf $(VENV) $(APPS_VENV) levelzero-data
