# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the suite).
VENV   := .venv
PY     := $(VENV)/bin/python
PORUN  := $(VENV)/bin/poprun

.PHONY: setup demo test test-unit test-launch test-parallel test-lightning test-packaging test-multihost test-slurm test-gridengine lint bench gpu-check clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(PORUN) --num-instances 2 --num-replicas 4 $(PY) examples/train_digits.py

test: setup
	@bash scripts/test.sh

test-unit: setup
	$(PY) -m pytest tests/unit -q

test-launch: setup
	$(PY) -m pytest tests/launch -q

test-parallel: setup
	$(PY) -m pytest tests/parallel -q

test-lightning: setup
	$(PY) -m pytest tests/lightning tests/seeds/lightning -q

test-packaging: setup
	$(PY) -m pytest tests/packaging -q

test-multihost: setup
	@$(PY) -m tests.multihost.hosts check || true
	$(PY) -m pytest tests/multihost -q -rs

test-slurm: setup
	@PYTHONPATH=$(CURDIR) $(PY) -m tests.support.slurm_cluster check || true
	$(PY) -m pytest tests/slurm -q -rs

test-gridengine: setup
	@PYTHONPATH=$(CURDIR) $(PY) -m tests.support.gridengine_cluster check || true
	$(PY) -m pytest tests/gridengine -q -rs

lint: setup
	$(VENV)/bin/ruff check poprun popdist popdist_torch popdist_lightning _popdist_poptorch tests examples benchmarks
	$(VENV)/bin/ruff format --check poprun popdist popdist_torch popdist_lightning _popdist_poptorch
	$(VENV)/bin/mypy

bench: setup
	$(PY) benchmarks/run_all.py

# The GPU path (NCCL, local replicas on the GPU) and its figures; needs a CUDA GPU.
gpu-check: setup
	$(PY) scripts/gpu_check.py

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build *.egg-info
