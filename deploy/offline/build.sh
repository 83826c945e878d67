#!/usr/bin/env bash
# Builds every image of docker-compose.yml where no image registry is reachable (docs/operations/offline-images.md).
#
#   deploy/offline/build.sh            all of the below, each step skipped when its result is already there
#   deploy/offline/build.sh base       the base image, from Debian packages: debootstrap --variant=minbase bookworm
#                                      plus Python 3.11, then `docker import`    -> $BASE_IMAGE
#   deploy/offline/build.sh wheels     the wheelhouse: every Python package the images install, fetched on this host
#                                      with `pip download` (PyPI reaches the host, not the build containers), laid
#                                      out as a PEP 503 index
#   deploy/offline/build.sh kafka      the apache/kafka stand-in: kafka/pom.xml's jars (Maven Central) on Debian's
#                                      Java 17, with the official image's environment conventions -> $KAFKA_IMAGE
#   deploy/offline/build.sh prometheus the prom/prometheus stand-in: Debian's Prometheus       -> $PROMETHEUS_IMAGE
#   deploy/offline/build.sh streamtrain the streamtrain images (deploy/Dockerfile) through docker-compose with the
#                                      offline and CPU overrides, pip reading the wheelhouse over loopback
#
# Inside a build container plain HTTP to Debian's archive works (apt verifies packages by signature), HTTPS to PyPI
# does not (no CA bundle there): hence apt inside the builds and a wheelhouse for pip.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${STREAMTRAIN_OFFLINE_DIR:-$ROOT/.streamtrain/offline}
BASE_IMAGE=${STREAMTRAIN_BASE_IMAGE:-streamtrain-offline/python:3.11-bookworm}
KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$ROOT/kafka/pom.xml")
KAFKA_IMAGE=${STREAMTRAIN_KAFKA_IMAGE:-streamtrain-offline/kafka:$KAFKA_VERSION}
PROMETHEUS_IMAGE=${STREAMTRAIN_PROMETHEUS_IMAGE:-streamtrain-offline/prometheus:bookworm}
INDEX_PORT=${STREAMTRAIN_WHEEL_INDEX_PORT:-18765}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0   # the classic builder: BuildKit would fetch its frontend

step() { echo "==> offline build: $* ($(date +%H:%M:%S))"; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

build_base() {
  if have_image "$BASE_IMAGE"; then step "base $BASE_IMAGE already built"; return; fi
  command -v debootstrap >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  local rootfs=$WORK/rootfs
  rm -rf "$rootfs"; mkdir -p "$WORK"
  step "base: debootstrap --variant=minbase bookworm + python3 (about a minute; log $WORK/debootstrap.log)"
  debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
    bookworm "$rootfs" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log"; return 1; }
  # What python:3.11-slim offers: `python` and `pip` on PATH, pip installing into the system interpreter (the image is
  # the environment, as there), no apt lists or caches kept.
  rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$MIRROR" "$MIRROR" > "$rootfs/etc/apt/sources.list"
  chroot "$rootfs" apt-get clean
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/tmp/* "$rootfs"/var/log/*.log
  step "base: docker import -> $BASE_IMAGE"
  tar -C "$rootfs" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
    --message "debootstrap --variant=minbase bookworm + python3 (deploy/offline/build.sh)" - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
  docker image ls "$BASE_IMAGE"
}

requirements() {
  # The project's dependencies (pyproject.toml) and its build backend: all a `pip install .` in an image needs.
  python3 - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
data = tomllib.load(open(sys.argv[1], "rb"))
for req in data["build-system"]["requires"] + data["project"]["dependencies"] + ["wheel"]:
    print(req)
PY
}

build_wheels() {
  local wheels=$WORK/wheels index=$WORK/index stamp=$WORK/wheels/.requirements
  mkdir -p "$wheels"
  if [[ -f $stamp ]] && cmp -s "$stamp" <(requirements); then
    step "wheels: wheelhouse up to date ($(du -sh "$wheels" | cut -f1))"
  else
    step "wheels: pip download (PyPI's torch wheel with its CUDA libraries: about 4 GB the first time)"
    requirements > "$WORK/requirements.txt"
    # Resolved for this host's interpreter, which must be what the images run: CPython 3.11 on glibc >= 2.36 x86_64.
    python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "the wheelhouse needs Python 3.11"; return 1; }
    python3 -m pip download --progress-bar off --only-binary=:all: -d "$wheels" -r "$WORK/requirements.txt" \
      | { grep --line-buffered -E '^(Saved|ERROR)' || true; } | sed -u 's/^/    /'
    [[ ${PIPESTATUS[0]} == 0 ]] || return 1
    requirements > "$stamp"
  fi
  # A PEP 503 "simple" index over the wheelhouse: pip and uv take it as --index-url like PyPI's.
  rm -rf "$index"; mkdir -p "$index/simple"
  python3 - "$wheels" "$index" <<'PY'
import os, re, sys
from collections import defaultdict
wheels, index = sys.argv[1:]
projects = defaultdict(list)
for name in sorted(os.listdir(wheels)):
    if name.endswith((".whl", ".tar.gz", ".zip")):
        projects[re.sub(r"[-_.]+", "-", name.split("-")[0]).lower()].append(name)
os.symlink(os.path.abspath(wheels), os.path.join(index, "files"))
for project, files in projects.items():
    os.makedirs(os.path.join(index, "simple", project))
    links = "".join(f'<a href="../../files/{f}">{f}</a><br>\n' for f in files)
    with open(os.path.join(index, "simple", project, "index.html"), "w") as out:
        out.write(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
with open(os.path.join(index, "simple", "index.html"), "w") as out:
    out.write("".join(f'<a href="{p}/">{p}</a><br>\n' for p in sorted(projects)))
print(f"    index: {len(projects)} projects")
PY
}

build_kafka() {
  if have_image "$KAFKA_IMAGE"; then step "kafka stand-in $KAFKA_IMAGE already built"; return; fi
  [[ -f $ROOT/kafka/libs/.resolved ]] || make -C "$ROOT" kafka
  local ctx=$WORK/kafka-context
  rm -rf "$ctx"; mkdir -p "$ctx"
  cp -r "$ROOT/deploy/offline/kafka/." "$ctx/"
  cp -r "$ROOT/kafka/libs" "$ctx/libs"; rm -f "$ctx/libs/.resolved"
  step "kafka stand-in: Kafka $KAFKA_VERSION's jars on Debian's Java 17 -> $KAFKA_IMAGE"
  docker build --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg KAFKA_VERSION="$KAFKA_VERSION" \
    -t "$KAFKA_IMAGE" "$ctx" | grep --line-buffered -E '^(Step|Successfully|E:)' | sed -u 's/^/    /'
  have_image "$KAFKA_IMAGE"
}

build_prometheus() {
  if have_image "$PROMETHEUS_IMAGE"; then step "prometheus stand-in $PROMETHEUS_IMAGE already built"; return; fi
  step "prometheus stand-in: Debian's Prometheus -> $PROMETHEUS_IMAGE"
  docker build --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$PROMETHEUS_IMAGE" "$ROOT/deploy/offline/prometheus" \
    | grep --line-buffered -E '^(Step|Successfully|E:)' | sed -u 's/^/    /'
  have_image "$PROMETHEUS_IMAGE"
}

serve_index() {
  # The wheelhouse's index on loopback; the builds run on the host's network (docker-compose.offline.yml) to read it.
  python3 -m http.server "$INDEX_PORT" --bind 127.0.0.1 --directory "$WORK/index" > "$WORK/index.log" 2>&1 &
  INDEX_PID=$!
  trap 'kill $INDEX_PID 2>/dev/null || true' EXIT
  for _ in $(seq 1 50); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$INDEX_PORT/simple/', timeout=1)" \
      2>/dev/null && return 0
    sleep 0.1
  done
  echo "the wheel index did not start on 127.0.0.1:$INDEX_PORT"; return 1
}

build_streamtrain() {
  [[ -d $WORK/index/simple ]] || build_wheels
  serve_index
  step "streamtrain images: docker-compose build (offline + CPU overrides; pip from the wheelhouse)"
  cd "$ROOT"
  local compose=(docker compose)
  docker compose version >/dev/null 2>&1 || compose=(docker-compose)
  STREAMTRAIN_WHEEL_INDEX=http://127.0.0.1:$INDEX_PORT/simple/ STREAMTRAIN_BASE_IMAGE=$BASE_IMAGE \
    "${compose[@]}" -f docker-compose.yml -f docker-compose.cpu.yml -f docker-compose.offline.yml \
    build kafka-setup trainer 2>&1 | grep --line-buffered -E 'Step [0-9]+/|Successfully|Building|ERROR|E:|Error' | sed -u 's/^/    /'
  docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep --line-buffered -E '^streamtrain' | sed -u 's/^/    /'
}

what=${1:-all}
start=$(date +%s)
case $what in
  base) build_base ;;
  wheels) build_wheels ;;
  kafka) build_base; build_kafka ;;
  prometheus) build_base; build_prometheus ;;
  streamtrain) build_base; build_streamtrain ;;
  all) build_base; build_wheels; build_kafka; build_prometheus; build_streamtrain ;;
  *) echo "usage: $0 [all|base|wheels|kafka|prometheus|streamtrain]" >&2; exit 2 ;;
esac
step "done in $(( $(date +%s) - start )) s"
