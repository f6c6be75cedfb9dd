# What the peers' setup_venv.sh scripts share, as functions; sourcing this file only sets
# `benchmarks` (this folder, absolute: the venvs live in it).
#
# setup_venv VENV WHAT CHECK
#   CHECK is Python that imports what the venv must hold and prints the versions; WHAT names the
#   venv in messages. A VENV that already passes CHECK ends the script at once (exit 0).
#   Otherwise: picks the Python the venv is made from ($PYTHON if set, else python3 on PATH),
#   checks it is >= 3.10 and can create venvs (else exits with a message naming the fix), sets
#   `python` to it, creates VENV and sets `start` (seconds since the epoch, for venv_done).
# venv_install VENV FAILURE SPEC...
#   One `pip install --no-cache-dir SPEC...` into VENV (one resolve, so the pins hold for every
#   package; the wheels are needed once, no cache); prints FAILURE and exits 1 if pip fails.
# venv_check VENV CHECK FAILURE
#   Runs CHECK in VENV (it prints the versions); prints FAILURE and exits 1 if it fails.
# venv_done VENV WHAT
#   The closing line: "Set up VENV with WHAT in N s." (N since setup_venv's `start`).
benchmarks="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

setup_venv() {
  local venv="$1" what="$2" check="$3"
  if [[ -x "${venv}/bin/python" ]] && "${venv}/bin/python" -c "${check}" >/dev/null 2>&1; then
    echo "${what} venv already set up: ${venv}"
    "${venv}/bin/python" -c "${check}"
    exit 0
  fi

  python="${PYTHON:-python3}"
  if ! command -v "${python}" >/dev/null 2>&1; then
    echo "No Python interpreter '${python}'$([[ -n "${PYTHON:-}" ]] && echo " (from \$PYTHON)" || echo " on PATH")." >&2
    echo "Install Python >= 3.10, or point PYTHON at one: PYTHON=/path/to/python3.11 bash $0" >&2
    exit 1
  fi
  if ! "${python}" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
    echo "$("${python}" -c 'import sys; print(sys.executable, sys.version.split()[0])') is too old:" \
         "this benchmark needs Python >= 3.10." >&2
    echo "Point PYTHON at a newer one: PYTHON=/path/to/python3.11 bash $0" >&2
    exit 1
  fi
  if ! "${python}" -c 'import venv, ensurepip' 2>/dev/null; then
    echo "${python} cannot create virtualenvs (no venv/ensurepip module)." >&2
    echo "On Debian/Ubuntu: apt-get install python3-venv (or python3.X-venv)." >&2
    exit 1
  fi
  echo "Using $("${python}" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  start=$(date +%s)
  "${python}" -m venv "${venv}"
}

venv_install() {
  local venv="$1" failure="$2"
  shift 2
  echo "Installing $* into ${venv} ..."
  if ! "${venv}/bin/python" -m pip install --no-cache-dir "$@"; then
    echo "${failure}" >&2
    exit 1
  fi
}

venv_check() {
  local venv="$1" check="$2" failure="$3"
  if ! "${venv}/bin/python" -c "${check}"; then
    echo "${failure}" >&2
    exit 1
  fi
}

venv_done() {
  echo "Set up $1 with $2 in $(( $(date +%s) - start )) s."
}
