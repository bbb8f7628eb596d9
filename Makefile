# The two commands: `make demo` runs the main job, `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_VENV := .bench-venv
BENCH_PY := $(BENCH_VENV)/bin/python
BENCH_STAMP := $(BENCH_VENV)/.installed

.PHONY: demo test pytest lint docs bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps litdata  # peers tests; its torchvision would replace torch
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m zerobatch.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks docs
	$(VENV)/bin/mypy src/zerobatch

# The site (docs/conf.py), strict: a broken reference or malformed docstring fails.
docs: $(STAMP)
	$(PY) -m sphinx -b html -n -W --keep-going -q docs build/docs/html -d build/docs/doctrees

# lint, docs and the tests at once: the tests leave the cores idle about a
# quarter of their run (subprocesses and servers starting, the last module),
# which lint and docs fill; each one's output is printed whole when it ends.
test: $(STAMP)
	$(MAKE) -j3 --output-sync=target lint docs pytest

# Two workers (TEST_WORKERS=0: one process). --dist loadscope runs each module on
# one worker: its module fixtures are built once.
TEST_WORKERS ?= 2
pytest: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope

$(BENCH_STAMP): pyproject.toml constraints.txt
	test -x $(BENCH_PY) || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PY) -m pip install --quiet --upgrade pip
	$(BENCH_PY) -m pip install --quiet torch==2.13.0
	$(BENCH_PY) -m pip install --quiet -c constraints.txt -e '.[dev,bench-packing]' datasets transferqueue==0.1.11 psutil lightning-utilities boto3 tifffile grain==0.2.18
	$(BENCH_PY) -m pip install --quiet --no-deps litdata  # its torchvision dependency would replace torch
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	for script in benchmarks/*.py; do $(BENCH_PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) $(BENCH_VENV) demo-output bench-output
