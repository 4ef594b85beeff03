#!/usr/bin/env bash
# Device check for the NVML source (issue 3, item 9): start gpuobs's NVML exporter on a free loopback
# port, scrape it, compare every GPU with `nvidia-smi --query-gpu`, print the table, write
# $OUT/nvml-check.txt and $OUT/nvml-page.txt when OUT is set, stop the exporter.
#
#   scripts/nvml-device-check.sh            (from any directory; needs an NVIDIA driver + nvidia-smi)
#
# Python: $PYTHON, else .venv/bin/python, else python3 -- the first (>= 3.11) that imports pynvml. If none
# does, nvidia-ml-py is pip-installed into a temporary venv (from ./.whl/ when that folder holds a wheel,
# else the configured index); failing that the check is inconclusive.
# Exit: 0 all GPUs match, 1 a mismatch or the exporter failed, 3 inconclusive. Bounded to ~3 minutes.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
CHECK_TIMEOUT_S=${CHECK_TIMEOUT_S:-150}
PIP_TIMEOUT_S=${PIP_TIMEOUT_S:-60}

inconclusive() {
  echo "INCONCLUSIVE: $*"
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && echo "INCONCLUSIVE: $*" > "$OUT/nvml-check.txt"; fi
  exit 3
}
py_ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1; }
has_nvml() { py_ok "$1" && "$1" -c 'import pynvml' >/dev/null 2>&1; }

PY=""
for cand in "${PYTHON:-}" .venv/bin/python python3; do
  [ -n "$cand" ] && has_nvml "$cand" && { PY=$cand; break; }
done
if [ -z "$PY" ]; then
  base=""
  for cand in "${PYTHON:-}" python3 python3.13 python3.12 python3.11; do
    [ -n "$cand" ] && py_ok "$cand" && { base=$cand; break; }
  done
  [ -n "$base" ] || inconclusive "no Python >= 3.11 on this machine"
  venv="$(mktemp -d)/venv"
  echo "pynvml is not importable: installing nvidia-ml-py into $venv" >&2
  src=()
  if compgen -G ".whl/nvidia_ml_py-*.whl" >/dev/null; then src=(--no-index --find-links .whl); fi
  if "$base" -m venv --system-site-packages "$venv" >/dev/null 2>&1 &&
     timeout "$PIP_TIMEOUT_S" "$venv/bin/python" -m pip install -q --disable-pip-version-check \
       --retries 0 --timeout 15 "${src[@]}" nvidia-ml-py >&2; then
    PY="$venv/bin/python"
  else
    inconclusive "nvidia-ml-py is missing and pip could not install it (offline?); carry a wheel in .whl/"
  fi
fi
"$PY" - <<'PYEOF'
import sys
from importlib import metadata
try:
    v = metadata.version("nvidia-ml-py")
except metadata.PackageNotFoundError:
    v = "unknown version"
print(f"python {sys.version.split()[0]} at {sys.executable}; nvidia-ml-py {v}")
PYEOF
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout -k 10 "$CHECK_TIMEOUT_S" "$PY" -m gpuobs.exporter.nvml.check
rc=$?
[ "$rc" -eq 124 ] && { echo "FAIL: the check ran past ${CHECK_TIMEOUT_S} s"; exit 1; }
exit "$rc"
