# streamtrain — the two commands a person needs: `make demo` and `make test`.
# Each installs what it needs (virtualenv at .venv with the `streamtrain` command, Kafka jars and the Java device
# example from Maven Central, Java/Maven from Debian when missing) and is quick the second time (stamp files).

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV_STAMP := $(VENV)/.installed
KAFKA_STAMP := kafka/libs/.resolved
JAVA_DEVICE := examples/java-device
JAVA_DEVICE_STAMP := $(JAVA_DEVICE)/target/.built
PYTEST_ARGS ?=

.PHONY: setup venv kafka java-device system-deps demo test lint unit integration faults cluster compose clean

setup: $(VENV_STAMP) $(KAFKA_STAMP) $(JAVA_DEVICE_STAMP)

venv: $(VENV_STAMP)

kafka: $(KAFKA_STAMP)

java-device: $(JAVA_DEVICE_STAMP)

# Java 17 runs the broker and compiles the Java device example; Maven resolves their jars; jemalloc is the allocator
# of CPU trainer ranks (steadier steps, trainer.cpu_allocator); iproute2 makes the hosts of `make cluster`; Prometheus
# scrapes `streamtrain up`; kcat (librdkafka's command-line client) sends the wire format's test vector in the
# integration tests and writes the JSON lines the bridge tests bridge (a non-Python client). The last four are optional (everything runs without them and says so, hence no failure when they
# cannot be installed). Each installed from Debian only when absent.
system-deps:
	@if ! command -v java >/dev/null || ! command -v javac >/dev/null || ! command -v mvn >/dev/null; then \
	  echo "installing Java 17 (with its compiler, for the Java device example) and Maven from Debian packages"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven; \
	fi
	@if ! /sbin/ldconfig -p 2>/dev/null | grep -q libjemalloc; then \
	  echo "installing jemalloc from Debian packages (the allocator of CPU trainer ranks)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libjemalloc2; } \
	    || echo "could not install libjemalloc2: CPU ranks will use the system allocator"; \
	fi
	@if ! command -v ip >/dev/null; then \
	  echo "installing iproute2 from Debian packages (the hosts of the multi-host test bed)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2; } \
	    || echo "could not install iproute2: the cluster tests will skip"; \
	fi
	@if ! command -v prometheus >/dev/null && [ ! -x /usr/bin/prometheus ]; then \
	  echo "installing Prometheus from Debian packages"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } \
	    || echo "could not install prometheus: streamtrain up will run without it"; \
	fi
	@if ! command -v kcat >/dev/null; then \
	  echo "installing kcat from Debian packages (the command-line device of the wire-format and bridge tests)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kcat; } \
	    || echo "could not install kcat: the tests that write with it (wire format, bridge) will skip"; \
	fi

$(VENV_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || \
	  { echo "streamtrain needs Python 3.11 (found $$($(PYTHON) --version))"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,plaid,onnx]'
	touch $@

$(KAFKA_STAMP): kafka/pom.xml | system-deps
	rm -rf kafka/libs
	mvn -q -B -f kafka/pom.xml dependency:copy-dependencies -DoutputDirectory=libs -DincludeScope=runtime
	touch $@

# The Java device example (Apache Avro and Kafka's Java client from Maven Central; its Sample class generated from
# streamtrain/wire/schemas/Sample.avsc) as one runnable jar, target/streamtrain-java-device.jar: the integration
# tests train on its samples.
$(JAVA_DEVICE_STAMP): $(JAVA_DEVICE)/pom.xml $(shell find $(JAVA_DEVICE)/src -type f) \
		streamtrain/wire/schemas/Sample.avsc | system-deps
	mvn -q -B -f $(JAVA_DEVICE)/pom.xml package
	touch $@

# The whole stack on PLAID for 75 s (broker, the replaying producer, coordinator, 4 ranks one of them 4x slower,
# Prometheus; examples/plaid-demo.toml), then its report; fails unless every produced sample was trained, truncated
# or dead-lettered. More: DEMO_ARGS="--policy static".
demo: setup system-deps
	$(VENV)/bin/streamtrain --config examples/plaid-demo.toml up --dataset plaid --rates 9,9,9,3 --duration 75 \
	  --out reports/demo $(DEMO_ARGS)
	@echo "report: reports/demo/report.json, plots in reports/demo/plots/"

# ruff (style), mypy (types), lint-imports (the package layering in pyproject.toml: the core imports no service),
# and the docs site built strictly (a broken link or anchor, or a page missing from the nav, fails; a few seconds).
lint: $(VENV_STAMP)
	$(VENV)/bin/ruff check streamtrain tests examples deploy \
	  docs/hooks
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy examples/*.py docs/hooks/*.py
	$(VENV)/bin/lint-imports --no-cache --no-logo
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir .streamtrain/site

test: setup compose-tool lint
	$(PY) -m pytest $(PYTEST_ARGS)

unit: setup compose-tool
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: setup
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

faults: setup
	$(PY) -m pytest tests/faults $(PYTEST_ARGS)

# The multi-host test bed (tests/cluster, left out of `make test`: ~25 min on 2 cores): seven hosts as network
# namespaces (needs root; the tests skip without it), three Kafka nodes, two torchrun nodes; host faults and elastic
# membership. The figures each test measures go to reports/cluster/figures.jsonl and the end of the output.
cluster: setup system-deps
	mkdir -p reports/cluster && rm -f reports/cluster/figures.jsonl
	STREAMTRAIN_CLUSTER_FIGURES=reports/cluster/figures.jsonl $(PY) -m pytest tests/cluster -m cluster $(PYTEST_ARGS)

# The production acceptance (tests/compose, left out of `make test`): Docker Engine installed and started when missing
# (and stopped again if this started it), every image built offline (deploy/offline/build.sh: base images from Debian
# packages, a wheelhouse, stand-ins for apache/kafka and prom/prometheus), then the unchanged docker-compose.yml up
# with the CPU and offline overrides, checked from the host, faulted, audited, down and up again. Needs root.
compose: setup system-deps
	bash deploy/offline/acceptance.sh $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) kafka/libs $(JAVA_DEVICE)/target .streamtrain .pytest_cache .mypy_cache .ruff_cache

# A real Compose parser for tests/unit/test_deploy_compose.py (`docker-compose config` validates and
# resolves the compose files without a Docker engine): kept when `docker compose` (v2) or a
# `docker-compose` is already installed, otherwise Debian's docker-compose package.
.PHONY: compose-tool
compose-tool:
	@if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then \
	  echo "installing docker-compose from Debian packages"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose; \
	fi
