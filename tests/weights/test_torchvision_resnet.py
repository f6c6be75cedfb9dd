"""torchvision/timm ResNet state dicts (.safetensors) import into our ResNet with equal logits.

The committed fixtures (tests/data/torchvision/*.safetensors) are random
state dicts in torchvision's exact key layout with the widths scaled down
(tests/weights/torchvision_layout.py wrote them with numpy; no torch). The
reference logits come from an independent numpy forward pass of the
torchvision architecture (NCHW, PyTorch padding, BN epsilon 1e-5).
"""

import dataclasses
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchvision_layout  # noqa: E402

from conftest import REPO, run_main  # noqa: E402
from tpu_models import cli  # noqa: E402
from tpu_models.errors import ConfigError, DataError  # noqa: E402
from tpu_models.registry import create_model  # noqa: E402
from tpu_models.weights import catalogue, importing, stores  # noqa: E402
from tpu_models.weights.mapping import WeightsMismatchError  # noqa: E402

ATOL = 1e-4
IMAGE = 64


def _fixture(name):
  return os.path.join(torchvision_layout.FIXTURES, name)


def _model(depth, width=4, num_classes=10, **overrides):
  params = dict(depth=depth, width=width, num_classes=num_classes, padding="symmetric",
                bn_epsilon=1e-5, input_shape=[IMAGE, IMAGE, 3])
  params.update(overrides)
  return create_model("resnet", **params)


def _images(n=2, seed=0):
  return np.random.default_rng(seed).standard_normal((n, IMAGE, IMAGE, 3)).astype(np.float32)


@pytest.mark.parametrize("file_name", sorted(torchvision_layout.TINY))
def test_imported_logits_equal_the_torchvision_forward_pass(file_name):
  depth, width, classes = torchvision_layout.TINY[file_name]
  model = _model(depth, width, classes)
  report = importing.load_weights(model, _fixture(file_name), "torchvision")
  assert len(report.loaded) == len(model.variables)
  assert {reason for _, reason in report.ignored} == {"BN step counters, not weights"}
  assert any("OIHW -> HWIO" in note for _, _, note in report.loaded)
  state = stores.open_store(_fixture(file_name))
  state = {name: state.get(name) for name in state.names()}
  images = _images()
  expected = torchvision_layout.forward(state, images, depth)
  logits = model(images, training=False).numpy()
  assert np.abs(expected).max() > 0.1  # Real logits, not zeros.
  assert np.abs(logits - expected).max() <= ATOL


def test_padding_and_epsilon_are_checked_and_matter():
  file_name = "resnet18_w4.safetensors"
  with pytest.raises(ConfigError, match="padding: symmetric"):
    importing.load_weights(_model(18, padding="same"), _fixture(file_name), "torchvision")
  with pytest.raises(ConfigError, match=r"BN epsilon \[0.001\].*1e-05"):
    importing.load_weights(_model(18, bn_epsilon=1e-3), _fixture(file_name), "torchvision")
  # The check is not pedantry: TensorFlow's "same" padding gives other logits.
  same = _model(18, padding="same")
  symmetric = _model(18)
  importing.load_weights(symmetric, _fixture(file_name), "torchvision")
  for ours, theirs in zip(same.variables, symmetric.variables):
    ours.assign(theirs)
  images = _images()
  assert np.abs(same(images).numpy() - symmetric(images).numpy()).max() > 1e-2


def test_wrong_depth_names_the_first_missing_tensor():
  with pytest.raises(WeightsMismatchError) as error:
    importing.load_weights(_model(34), _fixture("resnet18_w4.safetensors"), "torchvision")
  headline = str(error.value).split("\n")[0]
  assert headline.endswith("layer1.2.conv1.weight is not in the file (expected for our "
                           "stage2_block3_conv1/kernel [3, 3, 4, 4]).")
  assert len(error.value.report.missing) > 1  # The full list is in the report.
  assert "another depth or another architecture" in str(error.value)


def test_other_architecture_names_the_first_tensor_that_does_not_fit():
  with pytest.raises(WeightsMismatchError) as error:
    importing.load_weights(_model(18), _fixture("resnet50_w4.safetensors"), "torchvision")
  headline = str(error.value).split("\n")[0]
  assert ("layer1.0.conv1.weight has shape [4, 4, 1, 1] -> [1, 1, 4, 4]; expected [3, 3, 4, 4] "
          "for our stage2_block1_conv1/kernel" in headline)
  assert error.value.report.unused  # conv3 / bn3 of every bottleneck have no place.


def test_wrong_num_classes_and_truncated_file(tmp_path):
  with pytest.raises(WeightsMismatchError, match="fc.weight has shape .*expected .* logits/"):
    importing.load_weights(_model(18, num_classes=7), _fixture("resnet18_w4.safetensors"),
                           "torchvision")
  truncated = tmp_path / "truncated.safetensors"
  data = open(_fixture("resnet18_w4.safetensors"), "rb").read()
  truncated.write_bytes(data[:len(data) // 2])
  with pytest.raises(DataError, match="truncated.safetensors") as error:
    importing.load_weights(_model(18), str(truncated), "torchvision")
  assert "\n" not in str(error.value)


def test_catalogue_has_the_public_entries_with_their_facts():
  names = {e.name for e in catalogue.list_weights()}
  for name in ("torchvision_resnet50_imagenet1k_v1", "torchvision_resnet50_imagenet1k_v2",
               "torchvision_resnet18_imagenet1k_v1", "torchvision_resnet34_imagenet1k_v1",
               "torchvision_resnet101_imagenet1k_v1", "torchvision_resnet152_imagenet1k_v1",
               "timm_resnet50.a1_in1k", "timm_resnet50.tv_in1k", "keras_hub_resnet_50_imagenet",
               "model_garden_resnet50_imagenet"):
    assert name in names
  v2 = catalogue.get_weights("torchvision_resnet50_imagenet1k_v2")
  assert v2.download.startswith("https://download.pytorch.org/models/resnet50-11ad3fa6.pth")
  assert v2.accuracy["top1"] == 80.858
  assert v2.preprocessing.resize == 232 and v2.preprocessing.crop == 224
  assert v2.params["padding"] == "symmetric" and v2.params["bn_epsilon"] == 1e-5
  # Our task's mean/std are on the 0..255 scale.
  assert v2.task["mean"] == pytest.approx([123.675, 116.28, 103.53])
  assert v2.task["eval_crop_fraction"] == pytest.approx(224 / 232, abs=1e-6)
  assert catalogue.get_weights("timm_resnet50.a1_in1k").preprocessing.interpolation == "bicubic"
  assert "ResNet-vd" in catalogue.get_weights("keras_hub_resnet_vd_50_imagenet").refused


@pytest.fixture
def tiny_entry():
  entry = dataclasses.replace(
      catalogue.get_weights("torchvision_resnet18_imagenet1k_v1"), name="test_tiny_resnet18",
      files=("resnet18_w4.safetensors",),
      params={"padding": "symmetric", "bn_epsilon": 1e-5, "num_classes": 10, "width": 4,
              "input_shape": [IMAGE, IMAGE, 3]})
  catalogue.register_weights(entry)
  yield entry
  del catalogue.WEIGHTS[entry.name]


def test_import_writes_a_model_dir_for_evaluate_export_and_create_model(tmp_path, tiny_entry):
  from tpu_models import config as config_lib
  from tpu_models import export
  output = str(tmp_path / "imported")
  path = importing.import_weights(tiny_entry.name, torchvision_layout.FIXTURES, output,
                                  overrides=["task.train_data.source=synthetic",
                                             "task.eval_data.source=synthetic",
                                             "runtime.strategy=cpu"], say=lambda _: None)
  assert os.path.basename(path) == "ckpt-0"
  config = config_lib.load_config(os.path.join(output, "config.yaml"))
  assert config.task.image_size == 224 and config.task.eval_crop_fraction == 0.875
  assert config.task.model.params["padding"] == "symmetric"
  state = stores.open_store(_fixture("resnet18_w4.safetensors"))
  state = {name: state.get(name) for name in state.names()}
  images = _images()
  expected = torchvision_layout.forward(state, images, 18)
  _, exported = export.load_model(config, output)  # What evaluate/export/predict read.
  assert np.abs(exported(images, training=False).numpy() - expected).max() <= ATOL
  model = create_model("resnet18", weights=output, **tiny_entry.params)
  assert np.abs(model(images, training=False).numpy() - expected).max() <= ATOL
  with pytest.raises(WeightsMismatchError, match="does not hold every variable"):
    create_model("resnet34", weights=output, **tiny_entry.params)


@pytest.fixture
def run_cli(capfd, monkeypatch):
  """`tpu-models ARGS` run from the repository, in this process (no child importing
  TensorFlow again)."""
  monkeypatch.chdir(REPO)
  return lambda *args: run_main(capfd, cli.main, args)


def test_cli_lists_entries_and_a_missing_file_prints_where_to_get_it(tmp_path, run_cli):
  listed = run_cli("weights", "list")
  assert listed.returncode == 0, listed.stderr
  for name in ("torchvision_resnet50_imagenet1k_v1", "timm_resnet50.a1_in1k",
               "model_garden_resnet50_imagenet"):
    assert name in listed.stdout
  missing = run_cli("weights", "import", "torchvision_resnet50_imagenet1k_v1", str(tmp_path),
                    "--output", str(tmp_path / "out"))
  assert missing.returncode == 2
  assert "resnet50-0676ba61.safetensors or resnet50-0676ba61.pth" in missing.stderr
  assert "https://download.pytorch.org/models/resnet50-0676ba61.pth" in missing.stderr
  assert len(missing.stderr.strip().split("\n")) == 1
  refused = run_cli("weights", "import", "keras_hub_resnet_vd_50_imagenet", str(tmp_path),
                    "--output", str(tmp_path / "out"))
  assert refused.returncode == 2 and "ResNet-vd" in refused.stderr


# The torch peer's fixtures (benchmarks/torch/write_tiny_fixtures.py, run in its
# venv): narrow ResNets built, initialised and run by torchvision / timm
# themselves, with their logits on preprocessed photos.
TORCH_FIXTURES = os.path.join(REPO, "tests", "fixtures", "torch")
_TORCH_CLASSIFIERS = {"tv_resnet18_narrow": ("torchvision", 18),
                      "tv_resnet50_narrow": ("torchvision", 50),
                      "timm_resnet50_narrow": ("timm", 50)}


@pytest.mark.skipif(not os.path.isdir(TORCH_FIXTURES),
                    reason="tests/fixtures/torch (the torch peer's committed fixtures) not here")
@pytest.mark.parametrize("name", sorted(_TORCH_CLASSIFIERS))
def test_logits_equal_the_source_librarys_own_forward_pass(name):
  source, depth = _TORCH_CLASSIFIERS[name]
  path = os.path.join(TORCH_FIXTURES, f"{name}.safetensors")
  reference = np.load(os.path.join(TORCH_FIXTURES, f"{name}_reference.npz"))
  store = stores.open_store(path)
  model = _model(depth, width=store.shape("layer1.0.conv1.weight")[0],
                 stem_width=store.shape("conv1.weight")[0],
                 num_classes=store.shape("fc.weight")[0])
  importing.load_weights(model, path, source)
  logits = model(reference["inputs_nhwc"], training=False).numpy()
  assert np.abs(reference["logits"]).max() > 0.1
  assert np.abs(logits - reference["logits"]).max() <= ATOL
