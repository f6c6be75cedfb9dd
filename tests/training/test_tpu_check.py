"""`tpu-models check`: a static model passes, data-dependent shapes are flagged."""

import os

import toy_task
from conftest import run_main
from tpu_models import cli
from tpu_models.training import tpu_check

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_static_model_is_tpu_ready():
  report = tpu_check.check_config(toy_task.toy_config())
  assert report.ready, report.format()
  assert report.compiled


def test_dynamic_shape_inside_model_is_flagged():
  report = tpu_check.check_config(toy_task.toy_config(["task.model.name=toy_dynamic"]))
  assert not report.ready
  messages = [f.message for f in report.findings if f.kind == "dynamic_shape"]
  assert messages and "keep_positive" in messages[0] and "boolean_mask" in messages[0], \
      report.format()


def test_dynamic_input_dimension_and_float64_are_flagged():
  import tensorflow as tf

  class RaggedToy(toy_task.ToyTask):
    def build_inputs(self, split, input_context=None):
      x, y = toy_task.toy_arrays(10, 0)
      # batch() without drop_remainder: the batch dimension is unknown.
      return tf.data.Dataset.from_tensor_slices((x.astype("float64"), y)).batch(4)

  from tpu_models import registry
  with registry.scoped():
    registry.register_task("toy_ragged")(RaggedToy)
    report = tpu_check.check_config(toy_task.toy_config(["task.name=toy_ragged"]))
  kinds = {f.kind for f in report.findings if f.severity == "error"}
  assert {"dynamic_shape", "float64"} <= kinds, report.format()
  assert not report.ready


def test_cli_exit_codes(capfd):
  # The exit codes of `tpu-models check` (cli.main, the console script's entry), in this
  # process: no child importing TensorFlow again.
  base = ["check", os.path.join(TESTS, "toy.yaml"), "--import", "toy_task"]
  ok = run_main(capfd, cli.main, base)
  assert ok.returncode == 0, ok.stdout + ok.stderr
  assert "TPU-ready." in ok.stdout
  bad = run_main(capfd, cli.main, base + ["--set", "task.model.name=toy_dynamic"])
  assert bad.returncode == 1, bad.stdout + bad.stderr
  assert "NOT TPU-ready" in bad.stdout and "dynamic_shape" in bad.stdout
