# Everything a fresh machine needs, from two commands:
#   make demo   train the digits example on 2 local workers (--site local)
#   make test   install the system packages the tests need (root), lint, type-check and run
#               every test, the real Slurm cluster included (and build the docs)
#   make docs   the docs site into site/
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: demo test quick lint docs reference system-packages clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[tf,examples,dev,plot]'
	# tf_keras for the keras_fit example's tests, of the installed TensorFlow's minor version and
	# without the `tensorflow` it requires: the tensorflow-cpu above provides the same module.
	# Users install hpctf[keras2] instead (docs/explanation/keras-fit.md).
	$(BIN)/python -m pip install --quiet --no-deps "tf_keras==$$($(BIN)/python -c \
	  'import importlib.metadata as m; d = m.packages_distributions()["tensorflow"][0]; \
	  print(m.version(d).rsplit(".", 1)[0])').*"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/hpctf submit examples/digits/experiment.yaml --site local

lint: $(BIN)/.installed
	$(BIN)/ruff check hpctf tests examples benchmarks docs
	$(BIN)/mypy

# Debian's slurm-wlm, munge, shellcheck and the rest of tests/system-packages.sh's list, with
# apt (root), before the first test; a no-op once they are installed. `make demo` needs none.
system-packages:
	@tests/system-packages.sh

# The real-Slurm tests start tests/slurm/cluster.sh themselves. HPCTF_REQUIRE_SLURM turns a
# missing tool or a cluster that does not start into a failure instead of a skip. Two pytest-xdist
# workers, each with a Slurm cluster of its own (tests/conftest.py): most real-Slurm tests wait
# on the scheduler (requeue, walltime, MinJobAge) rather than compute, so two overlap well even
# on 2 cores. HPCTF_SLURM_ACCOUNTING=1: the clusters keep real accounting (MariaDB + slurmdbd,
# about 9 s at start), so sacct answers for jobs slurmctld has forgotten, as on a real site.
# Tests marked both_slurms run again on a second cluster, Slurm 24.11 with Python 3.13 workers,
# from a Debian 13 root built once by tests/slurm/debian13-root.sh (about 2 minutes, 2.2 GB,
# cached in ~/.cache/hpctf-slurm2411/).
TEST_WORKERS ?= 2
test: system-packages lint
	HPCTF_REQUIRE_SLURM=1 HPCTF_SLURM_ACCOUNTING=1 $(BIN)/python -m pytest -ra --durations=10 -n $(TEST_WORKERS) --dist worksteal

# The quick subset for iterating (about a minute on 2 cores): lint, then every test that starts
# neither Slurm, TensorFlow workers nor the oldest-TensorFlow environment.
quick: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slurm and not tf and not compat"

# The generated blocks of docs/reference (commands, experiment and site keys, the Python API),
# written anew from the code; tests/test_docs.py fails while they are stale.
reference: $(BIN)/.installed
	$(BIN)/python docs/_hooks/reference.py

# The docs site (docs/, mkdocs.yml) into site/, in strict mode: a broken link, anchor or reference
# fails it (tests/test_docs.py builds it too, in the test command).
docs: $(BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site

# hpctf's benchmarks (benchmarks/README.md): a table on stdout and hpctf-benchmarks.json.
# The full run takes about 40 minutes on the shared 2-core VM (the 100,000-step soak, with the
# other sections beside it); `make bench BENCH_ARGS=--tiny` is the CI size (a few minutes).
.PHONY: bench
bench: $(BIN)/.installed
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)
