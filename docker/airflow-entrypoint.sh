#!/usr/bin/env bash
# The Airflow image's entrypoint: refuse empty or placeholder secrets (.env.example's change-me
# values are public), then hand over to the base image's own entrypoint. A service that runs with
# the example JWT secret or Fernet key lets anyone who reaches it sign admin tokens or decrypt
# connection passwords. The check is pipeline_lib/secret_check.py; it never prints a value.
set -euo pipefail
python -m pipeline_lib.secret_check
exec /entrypoint "$@"
