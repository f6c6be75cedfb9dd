"""Tensor stores read each format into {name: numpy array}, and say clearly what is wrong."""

import json
import os

import numpy as np
import pytest

from tpu_models.errors import ConfigError, DataError
from tpu_models.weights import stores
from tpu_models.weights.mapping import (NameMap, Source, WeightsMismatchError, assign_name_map,
                                        conv_kernel_from_oihw, dense_kernel_from_out_in)


def test_layout_conversions():
  oihw = np.arange(2 * 3 * 5 * 7, dtype=np.float32).reshape(2, 3, 5, 7)
  hwio = conv_kernel_from_oihw(oihw)
  assert hwio.shape == (5, 7, 3, 2) and hwio[4, 6, 2, 1] == oihw[1, 2, 4, 6]
  dense = np.arange(6, dtype=np.float32).reshape(2, 3)
  assert np.array_equal(dense_kernel_from_out_in(dense), dense.T)
  with pytest.raises(ConfigError, match="4-D"):
    conv_kernel_from_oihw(dense)


def test_keras_preset_directory(tmp_path):
  import h5py
  with open(tmp_path / "config.json", "w") as f:
    json.dump({"class_name": "SomeBackbone", "config": {"depth": 2}}, f)
  kernel = np.random.default_rng(0).standard_normal((3, 3, 2, 4)).astype(np.float32)
  with h5py.File(tmp_path / "model.weights.h5", "w") as h5:
    h5.create_dataset("layers/conv1_conv/vars/0", data=kernel)
    h5.create_dataset("layers/conv1_bn/vars/0", data=np.ones(4, np.float32))
  assert stores.detect_format(str(tmp_path)) == "keras_preset"
  store = stores.open_store(str(tmp_path))
  assert store.config["config"]["depth"] == 2
  assert store.names() == ["layers/conv1_bn/vars/0", "layers/conv1_conv/vars/0"]
  assert store.shape("layers/conv1_conv/vars/0") == (3, 3, 2, 4)
  assert np.array_equal(store.get("layers/conv1_conv/vars/0"), kernel)
  os.remove(tmp_path / "model.weights.h5")
  with pytest.raises(DataError, match="lacks model.weights.h5"):
    stores.KerasPresetStore(str(tmp_path))


def test_unknown_format_and_torch_pickles_without_torch(tmp_path):
  with pytest.raises(DataError, match="Cannot tell the weights format"):
    stores.open_store(str(tmp_path / "weights.npz"))
  pth = tmp_path / "model.pth"
  pth.write_bytes(b"not a pickle")
  try:
    import torch  # noqa: F401
  except ImportError:
    with pytest.raises(ConfigError, match="needs torch"):
      stores.open_store(str(pth))
  else:
    with pytest.raises(DataError, match="not a readable PyTorch state dict"):
      stores.open_store(str(pth))


def test_unused_tensors_are_errors_unless_ignored(tmp_path):
  import keras
  from safetensors.numpy import save_file
  inputs = keras.Input((3,))
  model = keras.Model(inputs, keras.layers.Dense(2, name="dense")(inputs))
  path = str(tmp_path / "dense.safetensors")
  weight = np.arange(6, dtype=np.float32).reshape(2, 3)
  save_file({"fc.weight": weight, "fc.bias": np.ones(2, np.float32),
             "extra.counter": np.zeros((), np.int64)}, path)
  name_map = NameMap({"dense/kernel": Source(("fc.weight",), dense_kernel_from_out_in, "T"),
                      "dense/bias": Source(("fc.bias",))})
  before = model.get_layer("dense").kernel.numpy().copy()
  with pytest.raises(WeightsMismatchError) as error:
    assign_name_map(model, name_map, stores.open_store(path))
  assert str(error.value).split("\n")[0].endswith(
      f"extra.counter [] has no place in model {model.name!r}.")
  assert error.value.report.unused == ["extra.counter"]
  # All or nothing: the tensors that did fit were not assigned either.
  assert np.array_equal(model.get_layer("dense").kernel.numpy(), before)
  name_map.ignore(r"^extra\.", "a counter")
  report = assign_name_map(model, name_map, stores.open_store(path))
  assert report.ignored == [("extra.counter", "a counter")]
  assert np.array_equal(model.get_layer("dense").kernel.numpy(), weight.T)
