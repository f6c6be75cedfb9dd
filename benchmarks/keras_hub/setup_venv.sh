#!/usr/bin/env bash
# Creates an isolated venv with keras-hub beside tensorflow 2.21 (Keras 3), numpy and scikit-image.
# It is the keras-hub peer of the weight-import parity checks: there keras-hub writes random-weight
# presets (config.json + model.weights.h5) of its own full architectures and its own reference
# outputs on real photos (benchmarks/keras_hub/write_fixtures.py, write_tiny_fixtures.py). keras-hub
# is never a dependency of tpu_models or of CI; nothing here downloads weights.
#
# Usage:
#   bash benchmarks/keras_hub/setup_venv.sh
#   KERAS_HUB_VENV=/work/venv-kerashub bash benchmarks/keras_hub/setup_venv.sh  # default: benchmarks/.venv-keras-hub
#   KERAS_HUB_VERSION=0.24.0 bash benchmarks/keras_hub/setup_venv.sh           # default: newest that installs
#   PYTHON=/usr/bin/python3.11 bash benchmarks/keras_hub/setup_venv.sh          # default: python3 on PATH
#
# tensorflow is pinned to the 2.21 series, the one tpu_models runs on, so both sides compute with
# the same kernels. Idempotent: exits at once if the venv already imports everything.
# Needs PyPI access and ~2.5 GB of disk (tensorflow is most of it).
set -euo pipefail

# shellcheck source=../venv_python.sh
source "$(dirname "${BASH_SOURCE[0]}")/../venv_python.sh"
venv="${KERAS_HUB_VENV:-${benchmarks}/.venv-keras-hub}"
check='import keras_hub, keras, tensorflow as tf, numpy, skimage, h5py; print("keras-hub", keras_hub.__version__, "keras", keras.__version__, "tensorflow", tf.__version__, "numpy", numpy.__version__, "scikit-image", skimage.__version__)'
# Exits if the venv is already set up; else creates it with a checked Python.
setup_venv "${venv}" "keras-hub" "${check}"

keras_hub_spec="keras-hub${KERAS_HUB_VERSION:+==${KERAS_HUB_VERSION}}"
# One resolve with tensorflow pinned, so keras-hub cannot pull another tensorflow.
venv_install "${venv}" "pip could not install tensorflow==2.21.* with ${keras_hub_spec} (+ scikit-image). Pin a keras-hub release that supports it: KERAS_HUB_VERSION=... bash $0" \
    "tensorflow==2.21.*" "${keras_hub_spec}" scikit-image
venv_check "${venv}" "${check}" \
    "The venv ${venv} was installed but does not import keras_hub/keras/tensorflow/skimage/h5py."
venv_done "${venv}" "$("${venv}/bin/python" -c "${check}")"
