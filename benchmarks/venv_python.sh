# Sourced by the peers' setup_venv.sh scripts: picks the Python a peer venv is made from
# ($PYTHON if set, else python3 on PATH), checks it is >= 3.10 and can create venvs, and sets
# `python` to it. Exits with a message naming the fix when it cannot.
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
