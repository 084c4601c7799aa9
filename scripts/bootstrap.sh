# Sourced by ./run and ./test: make .venv with the pinned dependencies, once per change.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

find_python() {
    for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "Python 3.11 or newer is needed (set PYTHON=/path/to/python3.11)." >&2
    return 1
}

if [ ! -x "$VENV/bin/python" ]; then
    echo "[bootstrap] creating $VENV"
    "$(find_python)" -m venv "$VENV"
fi
STAMP="$VENV/.installed-$(cat "$ROOT/pyproject.toml" "$ROOT/agent/pyproject.toml" | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
    echo "[bootstrap] installing pinned dependencies"
    # Some machines' pip configuration names absent local indexes; hide only that noise.
    # The agent from agent/ in the same command as the console, whose sn-agent pin it
    # satisfies: pip never looks the name up in an index.
    LOG="$VENV/install.log"
    if ! { "$VENV/bin/python" -m pip install --quiet --upgrade pip &&
        "$VENV/bin/python" -m pip install --quiet -e "$ROOT/agent" -e "$ROOT[dev]"; } >"$LOG" 2>&1; then
        grep -v "is ignored: it is neither a file nor a directory" "$LOG" >&2 || true
        echo "[bootstrap] installing the dependencies failed (full log: $LOG)" >&2
        exit 1
    fi
    rm -f "$VENV"/.installed-*
    touch "$STAMP"
fi
