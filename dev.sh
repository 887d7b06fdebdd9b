#!/usr/bin/env bash
# One entry point for newcomers and CI:  ./dev.sh demo  |  ./dev.sh test [pytest args]  |  ./dev.sh notebook  |  ./dev.sh setup
# Creates .venv on first use and installs what the command needs. A torch >= 2.11 already
# in .venv is kept (install your CUDA build there first on a GPU machine); otherwise the
# CPU build torch==2.13.0 is installed. FXFLASH_VENV names another venv; FXFLASH_TORCH pins
# the torch version installed there and FXFLASH_PIP_EXTRA adds requirements beside it
# (docs/development.md: the tests on the oldest supported torch).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${FXFLASH_VENV:-.venv}

setup() {
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  if [ -n "${FXFLASH_TORCH:-}" ]; then
    # shellcheck disable=SC2086  # FXFLASH_PIP_EXTRA: several requirements, split on spaces
    "$VENV/bin/pip" install -q "torch==$FXFLASH_TORCH" ${FXFLASH_PIP_EXTRA:-}
  elif ! "$VENV/bin/python" - <<'PYEOF' 2>/dev/null
import torch, sys
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 11) else 1)
PYEOF
  then
    "$VENV/bin/pip" install -q torch==2.13.0
  fi
  # fxflash (editable) and its test requirements: installed again only when pyproject.toml changed
  stamp="$VENV/.fxflash-installed-$(sha256sum pyproject.toml | cut -c1-16)"
  if [ ! -f "$stamp" ] || ! "$VENV/bin/python" -c "import fxflash, pytest, hypothesis" 2>/dev/null; then
    "$VENV/bin/pip" install -q -e ".[dev]"
    rm -f "$VENV"/.fxflash-installed-*
    touch "$stamp"
  fi
}

cmd=${1:-}
shift || true
case "$cmd" in
  setup) setup ;;   # the venv and what the tests need, nothing run (.ci/run, before its parallel runs)
  demo) setup; exec "$VENV/bin/python" -m fxflash.demo "$@" ;;
  test) setup; exec "$VENV/bin/python" -m pytest -q "$@" ;;
  notebook)  # the tour unless a notebook is named first
    setup
    if [ $# -eq 0 ] || [ "${1#-}" != "$1" ]; then set -- notebooks/fxflash_tour.ipynb "$@"; fi
    exec "$VENV/bin/python" notebooks/execute.py "$@" ;;
  *) echo "usage: ./dev.sh demo | ./dev.sh test [pytest args] | ./dev.sh notebook [NOTEBOOK] [--write] | ./dev.sh setup" >&2; exit 2 ;;
esac
