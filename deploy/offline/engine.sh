#!/usr/bin/env bash
# Docker Engine for `make compose` on a machine that may not have one.
#
#   deploy/offline/engine.sh start   installs Debian's docker.io and docker-compose when missing, and Compose v2
#                                    (`docker compose`, built from its Go module: the CPU override needs its `!reset`)
#                                    when the Docker CLI has none; starts dockerd when no daemon answers, and records
#                                    that it did (STATE_DIR/dockerd.pid)
#   deploy/offline/engine.sh stop    stops dockerd only when `start` started it (a daemon that was already
#                                    running, e.g. a system service, is left alone)
#
# dockerd runs with a daemon.json of its own (STATE_DIR/daemon.json, or /etc/docker/daemon.json when that exists):
# the cgroupfs driver (no systemd here) and default ulimits no higher than this machine's hard limits, since a VM
# without CAP_SYS_RESOURCE cannot let runc raise them and every container would fail to start.
set -euo pipefail

STATE_DIR=${STREAMTRAIN_ENGINE_STATE:-$(cd "$(dirname "$0")/../.." && pwd)/.streamtrain/engine}
PIDFILE=$STATE_DIR/dockerd.pid
LOG=$STATE_DIR/dockerd.log

log() { echo "engine: $*"; }

daemon_up() { docker info >/dev/null 2>&1; }

install_engine() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v docker >/dev/null || missing+=(docker.io)
  if ((${#missing[@]})); then
    log "installing ${missing[*]} from Debian packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

COMPOSE_VERSION=${STREAMTRAIN_COMPOSE_VERSION:-v2.29.7}
PLUGIN=/usr/local/lib/docker/cli-plugins/docker-compose

install_compose_v2() {
  docker compose version >/dev/null 2>&1 && return 0
  command -v go >/dev/null || { log "no Go toolchain to build Compose $COMPOSE_VERSION with: install one (go 1.21+)"; return 1; }
  log "building Compose $COMPOSE_VERSION from its Go module (minutes the first time; log $STATE_DIR/compose-build.log)"
  local started=$SECONDS
  GOBIN=$STATE_DIR/bin go install -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$COMPOSE_VERSION" \
    "github.com/docker/compose/v2/cmd@$COMPOSE_VERSION" > "$STATE_DIR/compose-build.log" 2>&1 \
    || { tail -20 "$STATE_DIR/compose-build.log"; return 1; }
  install -D -m 0755 "$STATE_DIR/bin/cmd" "$PLUGIN"
  log "$(docker compose version) installed as $PLUGIN in $((SECONDS - started)) s"
}

write_daemon_json() {
  # One soft/hard pair per limit, at this machine's hard limit (capped, so an "unlimited" host stays sane).
  local nofile nproc
  nofile=$(ulimit -Hn); [[ $nofile == unlimited ]] && nofile=1048576
  nproc=$(ulimit -Hu); [[ $nproc == unlimited ]] && nproc=1048576
  cat > "$1" <<JSON
{
  "exec-opts": ["native.cgroupdriver=cgroupfs"],
  "default-ulimits": {
    "nofile": {"Name": "nofile", "Soft": $nofile, "Hard": $nofile},
    "nproc": {"Name": "nproc", "Soft": $nproc, "Hard": $nproc}
  },
  "log-driver": "json-file",
  "log-opts": {"max-size": "20m", "max-file": "2"}
}
JSON
}

start() {
  mkdir -p "$STATE_DIR"
  install_engine
  install_compose_v2
  if daemon_up; then
    log "a Docker daemon is already running ($(docker version -f '{{.Server.Version}}' 2>/dev/null)); using it"
    return 0
  fi
  local config=/etc/docker/daemon.json
  if [[ ! -f $config ]]; then
    config=$STATE_DIR/daemon.json
    write_daemon_json "$config"
  fi
  log "starting dockerd (config $config, log $LOG)"
  # setsid: dockerd outlives this script and make's shell, and is stopped by `stop` through its pid.
  setsid dockerd --config-file "$config" >"$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  for _ in $(seq 1 60); do
    if daemon_up; then
      log "dockerd $(docker version -f '{{.Server.Version}}') up (pid $(cat "$PIDFILE"), storage $(docker info -f '{{.Driver}}'))"
      return 0
    fi
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      log "dockerd exited at start; its log:"; tail -20 "$LOG"; rm -f "$PIDFILE"; return 1
    fi
    sleep 1
  done
  log "dockerd did not answer within 60 s; its log:"; tail -20 "$LOG"; return 1
}

stop() {
  if [[ ! -f $PIDFILE ]]; then
    log "dockerd was not started by this script: left running"
    return 0
  fi
  local pid; pid=$(cat "$PIDFILE")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping dockerd (pid $pid) and the containerd it started"
    kill -TERM "$pid"
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
