# One-command entry points. Every target installs what it needs first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test demo bench lint clean

install: $(STAMP)

# Re-install only when the pinned set or the package metadata changes: a second run is quick.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: install
	$(PY) -m migrate.demo

bench: install
	$(PY) bench/convert.py
	$(PY) bench/train_speed.py
	$(PY) bench/train_dp.py
	$(PY) bench/generate.py

lint: install
	$(VENV)/bin/ruff check migrate tests golden bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
