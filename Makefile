# streamtrain — the two commands a person needs: `make demo` and `make test`.
# Each installs what it needs (virtualenv at .venv with the `streamtrain` command, Kafka jars from
# Maven Central, Java/Maven from Debian when missing) and is quick the second time (stamp files).

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV_STAMP := $(VENV)/.installed
KAFKA_STAMP := kafka/libs/.resolved
PYTEST_ARGS ?=

.PHONY: setup venv kafka system-deps demo test lint unit integration faults clean

setup: $(VENV_STAMP) $(KAFKA_STAMP)

venv: $(VENV_STAMP)

kafka: $(KAFKA_STAMP)

# Java 17 runs the broker; Maven resolves its jars. Installed from Debian only when absent.
system-deps:
	@if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then \
	  echo "installing Java 17 and Maven from Debian packages"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless maven; \
	fi

$(VENV_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || \
	  { echo "streamtrain needs Python 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

$(KAFKA_STAMP): kafka/pom.xml | system-deps
	rm -rf kafka/libs
	mvn -q -B -f kafka/pom.xml dependency:copy-dependencies -DoutputDirectory=libs -DincludeScope=runtime
	touch $@

demo: setup
	$(VENV)/bin/streamtrain demo

lint: $(VENV_STAMP)
	$(VENV)/bin/ruff check streamtrain producers coordinator trainer stack benchmarks tests
	$(VENV)/bin/mypy

test: setup lint
	$(PY) -m pytest $(PYTEST_ARGS)

unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: setup
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

faults: setup
	$(PY) -m pytest tests/faults $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) kafka/libs .streamtrain .pytest_cache .mypy_cache .ruff_cache
