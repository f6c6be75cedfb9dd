"""tpu_models: a TPU-first model zoo for TensorFlow 2 + Keras 3."""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "tpu_models", "__init__.py")) as f:
  VERSION = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)
with open(os.path.join(HERE, "README.md")) as f:
  LONG_DESCRIPTION = f.read()

EXTRAS = {
    "coco": ["pycocotools>=2.0.7"],
    "text": ["sentencepiece>=0.2", "sacrebleu>=2.4"],
    # `tpu-models weights import` of .safetensors files (PyTorch state dicts without torch)
    # and keras-hub presets (h5py comes with TensorFlow); kagglehub fetches `kaggle://`
    # presets in `tpu-models weights get` (https and hf-hub files need no extra package).
    "weights": ["safetensors>=0.4", "kagglehub>=0.3"],
    # `tpu-models sweep` (docs/sweeps.md): trials on Ray Tune, the curves PNG with matplotlib.
    # Checked beside TensorFlow 2.21 on Python 3.11: ray 2.60.0, matplotlib 3.11, optuna 5.1.
    # Optuna: `sweep.search: optuna` (Tune's OptunaSearch).
    "sweep": ["ray[tune]>=2.40", "matplotlib>=3.7", "optuna>=3.0"],
    # `tpu-models serve` (docs/serving.md): Ray Serve's proxy, replicas and batching (brings
    # fastapi, starlette, uvicorn and prometheus_client). Checked beside TensorFlow 2.21 on
    # Python 3.11: ray 2.60.0.
    "serve": ["ray[serve]>=2.40"],
    # tritonclient[http]: the tests' real v2-protocol client (it pins ml-dtypes<=0.5.4,
    # which TensorFlow 2.21 and onnx accept). selenium drives the serving page's test in
    # Debian's headless Chromium (apt: chromium chromium-driver, scripts/setup.sh); checked
    # with selenium 4.51 and Chromium 156.
    "dev": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "scikit-image>=0.22",
            "tritonclient[http]>=2.40", "selenium>=4.11"],
}
EXTRAS["all"] = sorted({req for reqs in EXTRAS.values() for req in reqs})
# `tpu-models export --format litert|litert-int8|onnx` and `evaluate-export` (docs/deploy.md):
# the LiteRT interpreter (LiteRT exports also run on TensorFlow's tf.lite.Interpreter without
# it), the ONNX converter and runtime. Not in "all": CI installs it beside (.ci/run). Checked
# beside TensorFlow 2.21 on Python 3.11: ai-edge-litert 2.3.0, tf2onnx 1.17.0, onnx 1.23.2,
# onnxruntime 1.32.0 (protobuf 7 kept).
EXTRAS["deploy"] = ["ai-edge-litert>=2.0", "tf2onnx>=1.16", "onnx>=1.16", "onnxruntime>=1.18"]
# The keras-hub peer of the benchmark comparisons (benchmarks/classification, detection and
# text: compare_*.py); not in "all" (CI does not install it). keras-hub runs on the same
# TensorFlow and Keras 3, beside us. The Model Garden peer has its own venv
# (benchmarks/model_garden/setup_venv.sh).
EXTRAS["bench"] = ["keras-hub>=0.32"]

setup(
    name="tpu-models",
    version=VERSION,
    description="ResNet, EfficientNet, ViT, Transformer, RetinaNet and Mask R-CNN on one "
                "TPU-first training loop (TensorFlow 2 + Keras 3), with offline "
                "pretrained-weight import.",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tpu_models", "tpu_models.*"]),
    python_requires=">=3.10",
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "tensorflow-text>=2.21,<2.22",
        "tensorflow-datasets>=4.9",
        "keras>=3.10",
        "absl-py>=2.1",
        "numpy>=1.26",
        "pyyaml>=6.0",
        "tensorboard>=2.20",
    ],
    extras_require=EXTRAS,
    # Families: the built-in ones are found on disk (every tpu_models/**/family.py), so
    # they need no entry here. A separately installed family adds itself to the group
    # "tpu_models.families" with an entry naming its registry.Family, e.g.
    #   entry_points={"tpu_models.families": ["mine = my_models.family:FAMILY"]}
    # (tests/plugin_package is one; docs/custom_model.md).
    entry_points={"console_scripts": ["tpu-models=tpu_models.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: Apache Software License",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    license="Apache-2.0",
)
