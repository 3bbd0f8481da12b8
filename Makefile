# The two commands a new user needs: `make run` and `make test`.
SHELL := /bin/bash
# Two environments (scripts/setup): the workflow engine's, and the ESOL example's steps'
# (molflux needs numpy<2; the engine has numpy 2). The workflow runs the steps with the second.
VENV := .venv
BIN := $(VENV)/bin
STEP_BIN := .venv-esol/bin
SNAKEMAKE := $(BIN)/snakemake

.PHONY: help setup run run-slurm digits test test-fast lint docs dag bench browser sshd clean cluster-up cluster-down

help:
	@echo "make run        set up .venv (engine) and .venv-esol (steps), run the pipeline locally (profiles/local),"
	@echo "                then write its report, results/report.html"
	@echo "make test       set up and run every test, the real-SLURM ones included"
	@echo "make test-fast  unit tests only (no SLURM, no whole-workflow runs)"
	@echo "make run-slurm  run the pipeline through profiles/slurm (needs a cluster: make cluster-up)"
	@echo "make digits     set up .venv and run the second example (examples/digits) locally"
	@echo "make dag        render the job DAG and rule graph to dag/*.svg"
	@echo "make lint       ruff, mypy and snakemake --lint"
	@echo "make docs       build the documentation site (MkDocs, from docs/) into site/; open site/index.html"
	@echo "make bench      every benchmark (needs root for the test cluster); writes docs/benchmarks.md"

setup:
	@scripts/setup

run: setup
	$(SNAKEMAKE) --profile profiles/local
	$(BIN)/snakedvc report

run-slurm: setup
	$(SNAKEMAKE) --profile profiles/slurm

digits: setup
	cd examples/digits && ../../$(SNAKEMAKE) --profile ../../profiles/local

# --durations: the slowest tests, to keep the whole run short (CI's target is 45 minutes).
# scripts/test-engine runs the engine's tests in groups side by side (see there).
# (tests/esol, the ESOL steps' tests, run there too, in the steps' environment.)
test: setup docs cluster-up browser sshd
	scripts/test-engine

test-fast: setup
	$(STEP_BIN)/python -m pytest -m "not slurm and not slow" tests/esol
	$(BIN)/python -m pytest -m "not slurm and not slow"

lint: setup
	$(BIN)/ruff check src tests scripts examples
	$(BIN)/ruff format --check src tests examples
	$(BIN)/mypy src
	$(STEP_BIN)/mypy examples/esol/src
	# snakemake --lint, accepting only its request for per-rule conda envs (see the test)
	$(BIN)/python -m pytest -q tests/test_workflow.py -k lint

# The documentation site (mkdocs.yml): strict, so a broken link or anchor fails the build. The
# reference page's config keys and commands are generated from the kit (scripts/mkdocs_hooks.py).
# NO_MKDOCS_2_WARNING: Material prints a banner about MkDocs 2 on every build otherwise.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Job DAG and rule graph as SVG (graphviz installed if missing).
DAG_DIR ?= dag
dag: setup
	@scripts/ensure-apt graphviz
	@mkdir -p $(DAG_DIR)
	$(SNAKEMAKE) --dag --quiet all | dot -Tsvg > $(DAG_DIR)/dag.svg
	$(SNAKEMAKE) --rulegraph --quiet all | dot -Tsvg > $(DAG_DIR)/rulegraph.svg
	@echo "wrote $(DAG_DIR)/dag.svg $(DAG_DIR)/rulegraph.svg"

# The report tests open pages in a real headless Chromium; the report draws the DAG with graphviz.
browser:
	@scripts/ensure-apt chromium graphviz

# The tests of `--remote` start a real OpenSSH server on 127.0.0.1 (tests/sshd.py).
sshd:
	@scripts/ensure-apt openssh-server

bench: setup cluster-up
	scripts/bench

cluster-up:
	@scripts/slurm-cluster up

cluster-down:
	@scripts/slurm-cluster down

clean:
	rm -rf results logs .snakemake dag site
