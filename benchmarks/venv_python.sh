# Sourced by the peers' setup_venv.sh scripts once they set `venv` (its folder), `check` (Python
# that imports what the venv must hold and prints the versions) and `what` (its name in
# messages). A venv that already passes `check` ends the script at once (exit 0). Otherwise:
# picks the Python the venv is made from ($PYTHON if set, else python3 on PATH), checks it is
# >= 3.10 and can create venvs (else exits with a message naming the fix), sets `python` to
# it, creates the venv and sets `start` (seconds since the epoch, for the closing line).
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
