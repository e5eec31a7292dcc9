# Two entry points a fresh machine needs: `make demo` and `make test`.
# Both bootstrap their own virtual environment in .venv from nothing.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# Benchmark results are output, not source: written outside the tree unless told otherwise.
BENCH_OUT ?= $(HOME)/.cache/levelzero/bench/results.json

.PHONY: demo test bench lock clean

# constraints.txt pins every package to the version CI tested (regenerate with `make lock`).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -c constraints.txt -e '.[test,analysis]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/levelzero demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	$(VENV)/bin/levelzero bench --out $(BENCH_OUT)

lock: $(STAMP)
	{ echo "# Exact versions \`make test\` installs (pip install -c constraints.txt), so CI is reproducible."; \
	  echo "# Regenerate after changing dependencies: make lock"; \
	  $(VENV)/bin/pip freeze --all --exclude-editable | grep -v '^pip=='; } > constraints.txt

clean:
	rm -rf $(VENV) levelzero-data
