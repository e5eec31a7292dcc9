# Two entry points a fresh machine needs: `make demo` and `make test`.
# Both bootstrap their own virtual environment in .venv from nothing.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test,analysis]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/levelzero demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	$(VENV)/bin/levelzero bench

clean:
	rm -rf $(VENV) levelzero-data
