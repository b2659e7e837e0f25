#!/usr/bin/env bash
# The verl environment: a separate venv with verl==0.9.1 (CPU torch) and zarr_skip, for tests/verl_integration.
#
#   bash scripts/verl_env.sh venv    # create/refresh .venv-verl (idempotent: a stamp file)
#   bash scripts/verl_env.sh test    # venv, then `pytest tests/verl_integration -q` (extra args go to pytest)
#
# Environment: PYTHON (default python3), VERL_VENV (default .venv-verl).
# The stamp holds a hash of requirements-verl.txt and pyproject.toml: editing either rebuilds.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VERL_VENV:-.venv-verl}
PY=$VENV/bin/python
STAMP=$VENV/.installed

pip_install() {
    # the machine's pip config lists extra local indexes; drop their "is ignored" noise
    "$PY" -m pip install --quiet "$@" 2> >(grep -v "^WARNING: Location .* is ignored" >&2)
}

venv() {
    local want
    want=$(cat requirements-verl.txt pyproject.toml | sha256sum | cut -c1-16)
    if [[ -f $STAMP && "$(cat "$STAMP")" == "$want" ]]; then
        return 0
    fi
    local t0=$SECONDS
    echo "verl env: building $VENV" >&2
    [[ -x $PY ]] || "$PYTHON" -m venv "$VENV"
    # torch first, pinned: the CPU build of 2.13.0 (other versions pull CUDA wheels)
    "$PY" -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"
    pip_install -r requirements-verl.txt
    pip_install --no-deps -e .
    "$PY" -c "import verl, zarr_skip.integrations.verl as v; v.require_verl(); print('verl env: verl', verl.__version__)" >&2
    echo "$want" >"$STAMP"
    echo "verl env: built in $((SECONDS - t0)) s" >&2
}

case "${1:-test}" in
    venv)
        venv
        ;;
    test)
        shift || true
        venv
        exec "$PY" -m pytest tests/verl_integration -q "$@"
        ;;
    *)
        echo "usage: $0 [venv|test] [pytest args...]" >&2
        exit 2
        ;;
esac
