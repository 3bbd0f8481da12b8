# The two commands a new user needs: `make run` and `make test`.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
SNAKEMAKE := $(BIN)/snakemake

.PHONY: help setup run run-slurm test test-fast lint dag clean cluster-up cluster-down

help:
	@echo "make run        set up .venv and run the pipeline locally (profiles/local)"
	@echo "make test       set up and run every test, the real-SLURM ones included"
	@echo "make test-fast  unit tests only (no SLURM, no whole-workflow runs)"
	@echo "make dag        render the job DAG and rule graph to dag/*.svg"
	@echo "make lint       ruff, mypy and snakemake --lint"

setup:
	@scripts/setup

run: setup
	$(SNAKEMAKE) --profile profiles/local

test: setup
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m "not slurm and not slow"

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy src
	$(SNAKEMAKE) --lint

clean:
	rm -rf results logs .snakemake dag
