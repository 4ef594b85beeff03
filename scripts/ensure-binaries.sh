#!/usr/bin/env bash
# Make sure Prometheus, promtool, Alertmanager, amtool and VictoriaMetrics (victoria-metrics, vmalert:
# the HA topology, docs/ha.md) are on PATH. Installs Debian's packages when
# they are missing and apt-get is usable as root; otherwise explains how to install them and exits 2.
# Also installs Debian's chromium (headless, for the console's browser test) when root can, without
# failing when it cannot: only that test needs it.
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1; }
if ! have chromium && have apt-get && [ "$(id -u)" = 0 ]; then
  echo "Installing chromium from Debian (apt-get; headless browser test of the incident console)..."
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
    || echo "warning: chromium could not be installed; the console's browser test will say so" >&2
fi
missing() {
  have prometheus && have promtool && have amtool && { have prometheus-alertmanager || have alertmanager; } \
    && have victoria-metrics && have vmalert && return 1
  return 0
}
if ! missing; then exit 0; fi
if have apt-get && [ "$(id -u)" = 0 ]; then
  echo "Installing prometheus, prometheus-alertmanager and victoria-metrics from Debian (apt-get)..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager victoria-metrics >/dev/null
  # Debian's packages enable systemd units; the stack runs its own processes, so stop any the
  # package started (no-op where systemd is not running).
  if have systemctl && [ -d /run/systemd/system ]; then
    systemctl stop prometheus prometheus-alertmanager prometheus-node-exporter victoria-metrics 2>/dev/null || true
  fi
fi
if missing; then
  echo "gpuobs needs prometheus, promtool, amtool, prometheus-alertmanager (or alertmanager), victoria-metrics" >&2
  echo "and vmalert on PATH. Install them with:" >&2
  echo "  sudo apt-get install -y --no-install-recommends prometheus prometheus-alertmanager victoria-metrics" >&2
  echo "or put the upstream release binaries (prometheus.io/download) on PATH." >&2
  exit 2
fi
