"""The registry: a dict and a decorator, with helpful unknown-name errors."""

import os
import subprocess
import sys

import pytest

import tpu_models
from tpu_models import registry

from conftest import REPO


def test_register_create_and_list():
  @registry.register_model("test_registry_double", overwrite=True)
  def double(factor: int = 2):
    return ("double", factor)

  assert tpu_models.create_model("test_registry_double", factor=3) == ("double", 3)
  assert "test_registry_double" in tpu_models.list_models("test_registry_*")
  assert "resnet50" in tpu_models.list_models()
  assert "classification" in tpu_models.list_tasks()
  assert {"tfrecord", "fashion_mnist", "tfds"} <= set(tpu_models.list_datasets())


def test_unknown_name_lists_close_matches():
  with pytest.raises(KeyError, match="Unknown model 'resnet5'.*Did you mean: resnet50"):
    tpu_models.create_model("resnet5")


def test_duplicate_registration_is_an_error():
  registry.register_model("test_registry_dup", overwrite=True)(lambda: 1)
  with pytest.raises(ValueError, match="already registered"):
    registry.register_model("test_registry_dup")(lambda: 2)


def test_import_is_light():
  """`import tpu_models` pulls in no optional extra and adds < 1 s to tensorflow + keras."""
  code = """
import sys, time
t0 = time.perf_counter(); import tensorflow, keras; t1 = time.perf_counter()
import tpu_models; t2 = time.perf_counter()
heavy = [m for m in ("tensorflow_text", "pycocotools", "sacrebleu", "sentencepiece",
                     "tensorflow_datasets") if m in sys.modules]
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {','.join(heavy) or '-'}")
"""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True,
                       capture_output=True, text=True).stdout.split()
  base, extra, heavy = float(out[0]), float(out[1]), out[2]
  assert heavy == "-", f"import tpu_models imported optional extras: {heavy}"
  assert extra < 1.0, f"import tpu_models took {extra:.2f}s on top of tensorflow+keras ({base:.2f}s)"
