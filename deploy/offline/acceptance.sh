#!/usr/bin/env bash
# `make compose`: the production acceptance. Starts Docker Engine when none runs (installing it when missing), builds
# every image offline, runs tests/compose (the stack up, checked, faults, down), and leaves the machine as it found
# it: the acceptance's Compose project taken down with its volumes, dockerd stopped when this script started it.
# Extra arguments go to pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
started=$SECONDS
PROJECT=${STREAMTRAIN_COMPOSE_PROJECT:-streamtrain-acceptance}
export STREAMTRAIN_COMPOSE_PROJECT=$PROJECT

cleanup() {
  status=$?
  if docker info >/dev/null 2>&1; then
    docker compose -p "$PROJECT" --project-directory "$ROOT" -f docker-compose.yml -f docker-compose.cpu.yml \
      -f docker-compose.offline.yml down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  deploy/offline/engine.sh stop || true
  [[ -f reports/compose/figures.json ]] && echo "figures (reports/compose/figures.json):" && cat reports/compose/figures.json
  echo "make compose: $((SECONDS - started)) s, exit $status"
}
trap cleanup EXIT

# openssl for the test's certificates; debootstrap for the base image and the remote device's own root (its kcat).
for tool in openssl debootstrap; do
  command -v $tool >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $tool; }
done
rm -f reports/compose/figures.json
deploy/offline/engine.sh start
deploy/offline/build.sh all
echo "==> tests/compose ($(date +%H:%M:%S))"
.venv/bin/python -m pytest tests/compose -m compose --timeout=1200 "$@"
