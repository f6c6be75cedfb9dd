#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine for tpu_models: the local datasets from
# Debian packages, then the package itself with every extra.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi

# Fashion-MNIST (idx files) and the German-English dictionary: no network at run time.
# Chromium and its driver: the headless browser the serving page's test drives (selenium).
APT_PACKAGES="dataset-fashion-mnist trans-de-en chromium chromium-driver"
if command -v apt-get >/dev/null; then
  if ! dpkg -s $APT_PACKAGES >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $APT_PACKAGES
  fi
else
  echo "apt-get not found: put the Fashion-MNIST idx .gz files in \$TPU_MODELS_DATA/fashion-mnist" >&2
fi

python -m pip install --quiet --disable-pip-version-check -e ".[all,deploy]"
