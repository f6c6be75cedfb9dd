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


def _read_token_counts():
  raise FileNotFoundError("counts.npy does not exist: run `count` first.")


class _ReadsCountsWhenTraced(toy_task.ToyTask):
  """An eval step that reads a file while it is traced (as the LM's unigram baseline
  does): AutoGraph re-raises the FileNotFoundError as its own StagingError."""

  def eval_step(self, model, features, labels, weights):
    if self.config.data_seed >= 0:
      _read_token_counts()
    return super().eval_step(model, features, labels, weights)


def test_a_step_that_reads_a_missing_file_is_named_in_one_line(capfd, tmp_path):
  from tpu_models import registry
  with registry.scoped():
    registry.register_task("toy_reads_counts")(_ReadsCountsWhenTraced)
    report = tpu_check.check_config(toy_task.toy_config(["task.name=toy_reads_counts"]))
    # The eval step was not checked (a warning naming the file), the train step was.
    assert report.ready and report.compiled == ["train"], report.format()
    assert "the eval step reads data that is not here (counts.npy does not exist" in \
        report.format()
    # Training reaches the eval step: one line naming the file, exit 2, no traceback.
    train = run_main(capfd, cli.main, [
        "train", os.path.join(TESTS, "toy.yaml"), "--import", "toy_task",
        "--model-dir", str(tmp_path / "run"), "--set", "task.name=toy_reads_counts",
        "--set", "trainer.train_steps=2", "--set", "trainer.steps_per_loop=1",
        "--set", "trainer.eval_every=2"])
  assert train.returncode == 2, train.stdout + train.stderr
  assert "tpu-models train: error: counts.npy does not exist: run `count` first." in train.stderr
  assert "Traceback" not in train.stderr
