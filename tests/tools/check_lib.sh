# Sourced by the script checks in this folder: strict mode, a temporary folder $tmp removed on exit, and fail.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
