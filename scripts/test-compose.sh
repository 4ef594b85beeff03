#!/usr/bin/env bash
# `make test-compose`: the compose stack for real (tests/live/test_compose.py, and the profile `ha`:
# tests/live/test_compose_ha.py), with timings.
#   1. the Docker engine and Compose plugin (scripts/ensure-docker.sh: installed and started if needed,
#      as root); where the engine cannot run at all, the test is reported SKIPPED with the reason;
#   2. the images (scripts/build-images.sh; existing Debian root filesystems are kept);
#   3. the live test: stack up, drills across containers, network checks, down --volumes;
#   4. a dockerd started in step 1 is stopped again, and nothing of it may be left running.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
t0=$(date +%s)
started=$(mktemp --tmpdir gpuobs-dockerd.XXXXXX)
trap 'rm -f "$started"' EXIT

stop_engine() {
  local pid
  pid=$(cat "$started" 2>/dev/null)
  [ -n "$pid" ] || return 0
  echo "test-compose: stopping the dockerd started for this test (pid $pid)"
  kill "$pid" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then echo "test-compose: dockerd $pid did not stop" >&2; return 1; fi
  # dockerd's own containerd and any shim must be gone with it.
  if pgrep -P "$pid" >/dev/null 2>&1 || pgrep -f '^containerd-shim.*-namespace moby' >/dev/null; then
    echo "test-compose: processes of the stopped engine are still running" >&2; return 1
  fi
}

if ! why=$(scripts/ensure-docker.sh --started-file "$started" 2>&1); then
  echo "$why"
  reason=$(echo "$why" | tail -n 1)
  GPUOBS_COMPOSE_SKIP="$reason" "$PY" -m pytest -q -rs tests/live/test_compose.py tests/live/test_compose_ha.py
  exit $?
fi
[ -n "$why" ] && echo "$why"
t1=$(date +%s)
scripts/build-images.sh || { stop_engine; exit 1; }
t2=$(date +%s)
GPUOBS_COMPOSE_TEST=1 "$PY" -m pytest -q -rs --durations=3 tests/live/test_compose.py tests/live/test_compose_ha.py "$@"
rc=$?
t3=$(date +%s)
stop_engine || rc=1
echo "test-compose: engine $((t1 - t0)) s, images $((t2 - t1)) s, stack test $((t3 - t2)) s, total $(( $(date +%s) - t0 )) s (exit $rc)"
exit $rc
