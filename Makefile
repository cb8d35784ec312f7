# The project's single entry point. `make demo` and `make test` set everything up on first use.
SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
export LUNA_VENV := $(VENV)

.PHONY: setup demo test bench clean-venv

setup:
	@bash scripts/bootstrap.sh

demo: setup
	@$(VENV)/bin/luna demo

test: setup
	@bash scripts/run_tests.sh

bench: setup
	@bash scripts/run_benchmarks.sh

clean-venv:
	rm -rf $(VENV)
