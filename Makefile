# The README's two commands (`make demo`, `make test`) are the whole set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint demo bench soak clean venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all,test,bench]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check src tests bench examples
	$(PY) -m mypy

test: $(STAMP) lint
	$(PY) -m pytest -q

soak: $(STAMP)
	$(PY) -m pytest -q -m slow

demo: $(STAMP)
	$(PY) examples/order/demo.py

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
