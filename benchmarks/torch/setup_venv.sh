#!/usr/bin/env bash
# Creates benchmarks/.venv-torch: an isolated venv with PyTorch, torchvision, timm, safetensors,
# numpy and scikit-image. It is the PyTorch peer of the weight-import parity checks: there the
# source libraries write random-weight files of their own architectures and their own reference
# outputs (benchmarks/torch/write_fixtures.py, write_tiny_fixtures.py). torch is never a
# dependency of tpu_models or of CI; nothing here downloads weights.
#
# Usage:
#   bash benchmarks/torch/setup_venv.sh
#   TORCH_VENV=/somewhere/venv-torch bash benchmarks/torch/setup_venv.sh   # default: benchmarks/.venv-torch
#   TORCH_VERSION=2.9.1 TORCHVISION_VERSION=0.24.1 bash benchmarks/torch/setup_venv.sh
#   PYTHON=/usr/bin/python3.11 bash benchmarks/torch/setup_venv.sh        # default: python3 on PATH
#
# torch and torchvision are pinned as a pair (torchvision's compiled ops only load beside the torch
# they were built for). Defaults by `uname -m`: x86_64 torch 2.14.1 + torchvision 0.29.1 (a CUDA
# build, ~5.5 GB in the venv; it runs on the CPU), aarch64 torch 2.9.1 + torchvision 0.24.1 (a CPU
# build, ~0.7 GB). Idempotent: exits at once if the venv already imports everything.
set -euo pipefail

# shellcheck source=../venv_python.sh
source "$(dirname "${BASH_SOURCE[0]}")/../venv_python.sh"
venv="${TORCH_VENV:-${benchmarks}/.venv-torch}"
check='import torch, torchvision, timm, safetensors, numpy, skimage, importlib.metadata as m; torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5); print("torch", torch.__version__, "torchvision", torchvision.__version__, "timm", timm.__version__, "safetensors", m.version("safetensors"), "numpy", numpy.__version__, "scikit-image", skimage.__version__)'
# Exits if the venv is already set up; else creates it with a checked Python.
setup_venv "${venv}" "torch" "${check}"

case "$(uname -m)" in
  x86_64) default_torch=2.14.1; default_torchvision=0.29.1 ;;
  aarch64|arm64) default_torch=2.9.1; default_torchvision=0.24.1 ;;
  *) default_torch=2.9.1; default_torchvision=0.24.1 ;;
esac
torch_version="${TORCH_VERSION:-${default_torch}}"
torchvision_version="${TORCHVISION_VERSION:-${default_torchvision}}"
# One resolve, torch pinned: an unpinned torch (asked for by timm) could pull a newer multi-GB build.
venv_install "${venv}" "pip could not install torch==${torch_version} torchvision==${torchvision_version} (+ timm, safetensors, numpy, scikit-image). Pick a pair that exists for this Python and machine: TORCH_VERSION=... TORCHVISION_VERSION=... bash $0" \
    "torch==${torch_version}" "torchvision==${torchvision_version}" \
    timm safetensors numpy scikit-image
venv_check "${venv}" "${check}" \
    "The venv ${venv} was installed but does not import torch/torchvision/timm/safetensors/skimage (a torchvision built for another torch fails with 'operator torchvision::nms does not exist')."
venv_done "${venv}" "torch==${torch_version} torchvision==${torchvision_version}"
