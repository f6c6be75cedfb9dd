#!/usr/bin/env bash
# Creates an isolated venv with KServe's Python model server (the `kserve` package) beside
# tensorflow 2.21: the peer that benchmarks/serving/compare_serving.py measures against
# `tpu-models serve` (benchmarks/serving/kserve_peer.py serves the same SavedModel through a
# small kserve.Model, v2 protocol). kserve is never a dependency of tpu_models or of CI.
#
# Usage:
#   bash benchmarks/serving/setup_kserve_venv.sh
#   KSERVE_VENV=/work/venv-kserve bash benchmarks/serving/setup_kserve_venv.sh   # default: benchmarks/.venv-kserve
#   KSERVE_VERSION=0.15.2 bash benchmarks/serving/setup_kserve_venv.sh           # default: newest that installs
#   PYTHON=/usr/bin/python3.11 bash benchmarks/serving/setup_kserve_venv.sh      # default: python3 on PATH
#
# tensorflow is pinned to the 2.21 series, the one tpu_models runs on, so both servers run the
# same kernels. Idempotent: exits at once if the venv already imports everything.
# Needs PyPI access and ~2 GB of disk (tensorflow is most of it).
set -euo pipefail

# shellcheck source=../venv_python.sh
source "$(dirname "${BASH_SOURCE[0]}")/../venv_python.sh"
venv="${KSERVE_VENV:-${benchmarks}/.venv-kserve}"
check='import kserve, tensorflow as tf, numpy, importlib.metadata as m; print("kserve", m.version("kserve"), "tensorflow", tf.__version__, "numpy", numpy.__version__)'
# Exits if the venv is already set up; else creates it with a checked Python.
setup_venv "${venv}" "KServe" "${check}"

kserve_spec="kserve${KSERVE_VERSION:+==${KSERVE_VERSION}}"
# One resolve with tensorflow pinned, so kserve cannot pull another tensorflow or numpy.
venv_install "${venv}" "pip could not install tensorflow==2.21.* with ${kserve_spec}. Pin a kserve release that resolves with it: KSERVE_VERSION=... bash $0" \
    "tensorflow==2.21.*" "${kserve_spec}"
venv_check "${venv}" "${check}" \
    "The venv ${venv} was installed but does not import kserve/tensorflow/numpy."
venv_done "${venv}" "$("${venv}/bin/python" -c "${check}")"
