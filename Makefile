# Everything a fresh machine needs, from two commands:
#   make demo   train the digits example on 2 local workers (--site local)
#   make test   lint, type-check and run every test, the real Slurm cluster included
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: demo test lint clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[tf,examples,dev]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/hpctf submit examples/digits/experiment.yaml --site local

lint: $(BIN)/.installed
	$(BIN)/ruff check hpctf tests examples benchmarks
	$(BIN)/mypy

# The real-Slurm tests start tests/slurm/cluster.sh themselves (installing slurm-wlm and
# munge with apt on first use, as root). HPCTF_REQUIRE_SLURM turns their skip into a failure.
test: lint
	HPCTF_REQUIRE_SLURM=1 $(BIN)/python -m pytest -ra --durations=10

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
