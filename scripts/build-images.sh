#!/usr/bin/env bash
# Build every image the compose stack needs without any container registry (`make images`):
#   gpuobs-python:bookworm        Debian bookworm minbase + python3, python3-venv, iproute2 (mmdebstrap)
#   gpuobs-prometheus:bookworm    Debian bookworm minbase + prometheus (2.42), wget for the healthcheck
#   gpuobs-alertmanager:bookworm  Debian bookworm minbase + prometheus-alertmanager (0.25), wget
#   gpuobs-victoria-metrics:bookworm  Debian bookworm minbase + victoria-metrics (1.79: victoria-metrics
#                                 and vmalert), wget; only the compose profile `ha` uses it
#   gpuobs:<version>              compose/Dockerfile on gpuobs-python, installed from a wheelhouse that
#                                 `pip wheel` builds on this host (build/wheelhouse); built with
#                                 --network none, so nothing is fetched while the image builds.
# The root filesystems come from Debian packages (a Debian mirror, not a registry), are made by
# `mmdebstrap --variant=minbase` and turned into images with `docker import`. An image that already
# exists is kept (they change only with Debian point releases); GPUOBS_REBUILD=1 rebuilds them.
# Mirrors: GPUOBS_DEBIAN_MIRROR (default http://deb.debian.org/debian) and GPUOBS_DEBIAN_SECURITY
# (default http://deb.debian.org/debian-security); point them at the site's own mirror.
set -euo pipefail
cd "$(dirname "$0")/.."
SUITE=bookworm
MIRROR=${GPUOBS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${GPUOBS_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n 1)
PY=${PY:-.venv/bin/python}
WHEELS=build/wheelhouse
t_start=$(date +%s)

command -v mmdebstrap >/dev/null || {
  [ "$(id -u)" = 0 ] || { echo "build-images: mmdebstrap is missing; apt-get install mmdebstrap (as root)" >&2; exit 2; }
  echo "Installing mmdebstrap (apt-get)..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
}

# rootfs IMAGE "PACKAGES" "CUSTOMIZE-HOOK" IMPORT-CHANGE...
rootfs() {
  local image=$1 pkgs=$2 hook=$3; shift 3
  if [ "${GPUOBS_REBUILD:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
    echo "$image: present, kept (GPUOBS_REBUILD=1 rebuilds it)"; return
  fi
  local t0 tar versions changes=()
  t0=$(date +%s)
  tar=$(mktemp --tmpdir gpuobs-rootfs.XXXXXX.tar)
  versions=$(mktemp --tmpdir gpuobs-rootfs.XXXXXX.txt)
  echo "$image: mmdebstrap --variant=minbase $SUITE + $pkgs ..."
  # Recommends off (as in the native install); no apt lists or .debs left in the image (mmdebstrap
  # cleans them); the hook records the installed versions for the image's labels.
  mmdebstrap --quiet --variant=minbase --include="$pkgs" \
    --aptopt='APT::Install-Recommends "false"' \
    --customize-hook="$hook" \
    --customize-hook="chroot \"\$1\" dpkg-query -W -f '\${Package}=\${Version} ' $(echo "$pkgs" | tr , ' ') > $versions" \
    "$SUITE" "$tar" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY $SUITE-security main"
  for c in "$@"; do changes+=(--change "$c"); done
  docker import "${changes[@]}" \
    --change "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase: $(cat "$versions")\"" \
    "$tar" "$image" >/dev/null
  rm -f "$tar" "$versions"
  echo "$image: built in $(( $(date +%s) - t0 )) s ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
}

PATHS='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
# The root filesystems build in parallel (mostly download and unpack time), each into its log.
logs=$(mktemp -d --tmpdir gpuobs-rootfs-logs.XXXXXX)
rootfs gpuobs-python:$SUITE python3,python3-venv,iproute2 'true' "$PATHS" 'CMD ["python3"]' >"$logs/python" 2>&1 &
# Storage directories owned by the package's own `prometheus` user (its postinst creates it), so the
# named volumes mounted there start with that ownership, as the upstream images do with /prometheus.
rootfs gpuobs-prometheus:$SUITE prometheus,wget \
  'chroot "$1" install -d -o prometheus -g prometheus -m 0750 /prometheus' \
  "$PATHS" 'USER prometheus' 'WORKDIR /prometheus' 'EXPOSE 9090' 'ENTRYPOINT ["/usr/bin/prometheus"]' \
  >"$logs/prometheus" 2>&1 &
rootfs gpuobs-alertmanager:$SUITE prometheus-alertmanager,wget \
  'chroot "$1" install -d -o prometheus -g prometheus -m 0750 /alertmanager' \
  "$PATHS" 'USER prometheus' 'WORKDIR /alertmanager' 'EXPOSE 9093' 'ENTRYPOINT ["/usr/bin/prometheus-alertmanager"]' \
  >"$logs/alertmanager" 2>&1 &
# The HA profile's global store and vmalert: Debian's victoria-metrics package ships both binaries; its
# postinst creates the `_victoria-metrics` user, which owns the storage directory.
rootfs gpuobs-victoria-metrics:$SUITE victoria-metrics,wget \
  'chroot "$1" install -d -o _victoria-metrics -g _victoria-metrics -m 0750 /victoria-metrics' \
  "$PATHS" 'USER _victoria-metrics' 'WORKDIR /victoria-metrics' 'EXPOSE 8428' 'ENTRYPOINT ["/usr/bin/victoria-metrics"]' \
  >"$logs/victoria-metrics" 2>&1 &
failed=0
for job in $(jobs -p); do wait "$job" || failed=1; done
cat "$logs/python" "$logs/prometheus" "$logs/alertmanager" "$logs/victoria-metrics"
rm -rf "$logs"
[ "$failed" = 0 ] || { echo "build-images: a root filesystem failed to build (above)" >&2; exit 1; }

# The wheelhouse: gpuobs and every dependency as wheels for the image's Python (bookworm: 3.11).
img_py=$(docker run --rm --network none gpuobs-python:$SUITE python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
host_py=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$img_py" = "$host_py" ] || { echo "build-images: the wheelhouse is built with Python $host_py, the image has $img_py; run with PY=python$img_py" >&2; exit 2; }
t0=$(date +%s)
rm -rf "$WHEELS"
# A fixed SOURCE_DATE_EPOCH (1980-01-01, the earliest a zip can hold) makes the gpuobs wheel depend on
# the sources only: the same tree gives the same wheelhouse, and the image is not rebuilt.
SOURCE_DATE_EPOCH=315532800 \
  $PY -m pip wheel -q --disable-pip-version-check -w "$WHEELS" ".[k8s]" 2>&1 | grep -v "^WARNING: Location" || true
ls "$WHEELS"/gpuobs-"$VERSION"-*.whl >/dev/null
echo "wheelhouse: $(ls "$WHEELS" | wc -l) wheels in $(( $(date +%s) - t0 )) s"

# The image records a digest of everything it is built from; the same digest means nothing to rebuild.
inputs=$( { (cd "$WHEELS" && sha256sum -- *.whl); sha256sum compose/Dockerfile compose/node-entrypoint.sh;
            docker image inspect -f '{{.Id}}' gpuobs-python:$SUITE; } | sha256sum | cut -c1-64)
have=$(docker image inspect -f '{{index .Config.Labels "gpuobs.inputs"}}' "gpuobs:$VERSION" 2>/dev/null || true)
if [ "${GPUOBS_REBUILD:-0}" != 1 ] && [ "$have" = "$inputs" ]; then
  echo "gpuobs:$VERSION: up to date (same wheelhouse, Dockerfile and base)"
else
  t0=$(date +%s)
  log=$(mktemp --tmpdir gpuobs-build.XXXXXX.log)
  if ! DOCKER_BUILDKIT=0 docker build --network none -f compose/Dockerfile --label "gpuobs.inputs=$inputs" \
      --build-arg BASE_IMAGE=gpuobs-python:$SUITE -t "gpuobs:$VERSION" . >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; echo "build-images: gpuobs:$VERSION failed to build (above)" >&2; exit 1
  fi
  rm -f "$log"
  for l in gpuobs.stage=build gpuobs.image=gpuobs; do docker image prune -f --filter "label=$l" >/dev/null; done
  echo "gpuobs:$VERSION: built in $(( $(date +%s) - t0 )) s"
fi
echo "images ready in $(( $(date +%s) - t_start )) s"
