#!/usr/bin/env bash
# Creates benchmarks/.venv-model-garden: an isolated venv with TF Model Garden
# (tf-models-official), which pins its own tensorflow + tf-keras (Keras 2).
# It lives in its own venv so Keras 2 never leaks into the main environment
# (tpu_models is Keras 3 only). Used by the benchmarks' Model Garden workers
# (benchmarks/model_garden/*_worker.py, run by the drivers in each family folder).
#
# Usage:
#   bash benchmarks/model_garden/setup_venv.sh                # newest that installs
#   MG_VERSION=2.19.1 bash benchmarks/model_garden/setup_venv.sh
#   PYTHON=/usr/bin/python3.11 bash benchmarks/model_garden/setup_venv.sh   # default: python3 on PATH
#
# Idempotent: exits at once if the venv can already import Model Garden.
# Needs PyPI access and ~3.5 GB of disk (tensorflow, tf-keras, opencv, ...);
# takes ~5 minutes.
set -euo pipefail

# shellcheck source=../venv_python.sh
source "$(dirname "${BASH_SOURCE[0]}")/../venv_python.sh"
venv="${benchmarks}/.venv-model-garden"
check='import official.vision.modeling.factory, tf_keras, tensorflow as tf, importlib.metadata as m; print("tf-models-official", m.version("tf-models-official"), "tensorflow", tf.__version__, "tf-keras", m.version("tf-keras"))'
# Exits if the venv is already set up; else creates it with a checked Python.
setup_venv "${venv}" "Model Garden" "${check}"
"${venv}/bin/python" -m pip install --quiet --upgrade pip wheel setuptools

# Newest release first; the first that resolves and imports wins. Set MG_VERSION to pin.
versions="${MG_VERSION:-2.20.0 2.19.1 2.18.0}"

installed=""
for version in ${versions}; do
  echo "Installing tf-models-official==${version} into ${venv} ..."
  # --no-cache-dir: the wheels (tensorflow alone is ~600 MB) are needed once.
  if "${venv}/bin/python" -m pip install --no-cache-dir "tf-models-official==${version}" \
      && "${venv}/bin/python" -c "${check}"; then
    installed="${version}"
    break
  fi
  echo "tf-models-official==${version} did not install/import; trying the next." >&2
done

if [[ -z "${installed}" ]]; then
  echo "Could not install any of: ${versions}" >&2
  exit 1
fi
venv_done "${venv}" "tf-models-official==${installed}"
