"""Fault injection on configs, evaluate and export: bad values are one-line errors at load
time; evaluate leaves the run's config.yaml alone; export refuses to overwrite, says what it
exported, and serves a batch with a broken image; `tpu-models --version`."""

import io
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import tiny_image_model  # noqa: F401  (registers reliability_tiny_cnn)
import toy_task  # noqa: F401  (registers the toy task)
from conftest import REPO, run_main
from faults import _experiment, _jpeg, _write, checkpoint_inventory, error_line, truncate
from in_process import run_batch_here
from tpu_models import cli
from tpu_models import config as config_lib
from tpu_models.training.trainer import Trainer

TOY = os.path.join(REPO, "tests", "toy.yaml")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("config_faults")
  rng = np.random.default_rng(1)
  config = _experiment(tmp, "cls", _write(tmp / "train-0", 16, rng),
                       _write(tmp / "eval-0", 8, rng))
  cls, toy, damaged = tmp / "runs" / "cls", tmp / "runs" / "toy", tmp / "runs" / "damaged"
  saved = tmp / "saved"
  # The finished runs the faults are injected into (trained here: they are not the faults).
  for experiment, model_dir in ((config_lib.load_config(TOY, ["trainer.train_steps=20"]), toy),
                                (config_lib.load_config(str(config)), cls)):
    trainer = Trainer(experiment, str(model_dir), stream=io.StringIO())
    trainer.train()
    trainer.close()
  config_yaml = (toy / "config.yaml").read_text()
  # A copy of the classification run whose latest checkpoint is damaged: evaluate and export
  # use the newest readable one and leave the files where they are.
  shutil.copytree(cls, damaged)
  (data,) = damaged.glob("ckpt-4.data-*")
  truncate(data, 200)
  inventory = checkpoint_inventory(damaged)

  def train(model_dir, *overrides):
    argv = ["train", config, "--model-dir", model_dir, "--import", "tiny_image_model"]
    for o in overrides:
      argv += ["--set", o]
    return argv

  def cls_command(command, model_dir, *extra):
    return [command, config, "--import", "tiny_image_model", "--model-dir", model_dir, *extra]

  cases = {
      # Fault 5: evaluate (once, and --continuous) must not rewrite the run's config.yaml.
      "evaluate": ["evaluate", TOY, "--import", "toy_task", "--model-dir", toy,
                   "--set", "trainer.eval_steps=1"],
      "continuous": ["evaluate", TOY, "--import", "toy_task", "--model-dir", toy,
                     "--continuous", "--timeout", "5", "--set", "trainer.train_steps=20"],
      # Fault 8: values checked at load time.
      "batch_zero": train(tmp / "batch_zero", "task.train_data.global_batch_size=0"),
      "negative_steps": train(tmp / "negative_steps", "trainer.train_steps=-5"),
      "warmup": train(tmp / "warmup", "trainer.schedule.warmup_steps=10"),
      "target_typo": train(tmp / "target_typo", "trainer.target_metric=top_1",
                           "trainer.target_value=0.5"),
      "fashion_path": train(tmp / "fashion_path", "task.train_data.source=fashion_mnist",
                            "task.train_data.path=/no/such/fashion"),
      # Fault 9: export says what it exported and refuses to overwrite.
      "export": cls_command("export", cls, "--output", saved),
      "export_again": cls_command("export", cls, "--output", saved),
      "export_overwrite": cls_command("export", cls, "--output", saved, "--overwrite"),
      "evaluate_damaged": cls_command("evaluate", damaged),
      "export_damaged": cls_command("export", damaged, "--output", tmp / "saved_damaged"),
  }
  names = list(cases)
  # Config errors, evaluate and export are not about a process: run here, not in a child.
  outcome = dict(zip(names, run_batch_here(tmp, [cases[n] for n in names])))
  outcome.update(paths=dict(toy=toy, cls=cls, saved=saved, damaged=damaged, tmp=tmp),
                 config_yaml=config_yaml, inventory=inventory)
  return outcome


def test_evaluate_leaves_the_training_config_alone(runs):
  for case in ("evaluate", "continuous"):
    assert runs[case]["code"] == 0, runs[case]["stderr"] + runs[case]["traceback"]
  assert "eval at step 20" in runs["evaluate"]["stdout"]
  text = runs["config_yaml"]  # As training wrote it.
  assert "eval_steps: null" in text and "max_checkpoints: 3" in text
  assert (runs["paths"]["toy"] / "config.yaml").read_text() == text


@pytest.mark.parametrize("case,expected", [
    ("batch_zero", "'task.train_data.global_batch_size' must be >= 1; got 0"),
    ("negative_steps", "'trainer.train_steps' must be >= 1; got -5"),
    ("target_typo", "'trainer.target_metric' is 'top_1', which task 'classification' does not "
                    "report. Did you mean 'top1'?"),
    ("fashion_path", "Fashion-MNIST data.path '/no/such/fashion' does not exist"),
])
def test_bad_values_are_one_line_errors_before_training(runs, case, expected):
  assert runs[case]["code"] == 2
  assert expected in error_line(runs[case])
  assert not list((runs["paths"]["tmp"]).glob(f"{case}/ckpt-*"))


def test_warmup_longer_than_the_run_is_a_warning_in_the_run_log(runs):
  # Not an error: shortened runs of full recipes (smoke tests, benchmarks) do it on purpose.
  assert runs["warmup"]["code"] == 0, runs["warmup"]["stderr"] + runs["warmup"]["traceback"]
  assert ("Warning: trainer.schedule.warmup_steps (10) exceeds trainer.train_steps (4): the "
          "learning rate never gets past 40% of base_lr 0.01" in runs["warmup"]["stdout"])


def test_export_names_its_checkpoint_and_refuses_to_overwrite(runs):
  cls, saved = runs["paths"]["cls"], runs["paths"]["saved"]
  for case in ("export", "export_overwrite"):
    assert runs[case]["code"] == 0, runs[case]["stderr"] + runs[case]["traceback"]
  assert f"Exported checkpoint {cls}/ckpt-4 (step 4) to {saved}" in runs["export"]["stdout"]
  assert runs["export_again"]["code"] == 2
  assert "already exists; pass --overwrite" in error_line(runs["export_again"])
  assert '"step": 4' in (saved / "assets.extra" / "export.json").read_text()


def test_evaluate_and_export_skip_an_unreadable_latest_checkpoint_without_moving_it(runs):
  damaged = runs["paths"]["damaged"]
  for case in ("evaluate_damaged", "export_damaged"):
    result = runs[case]
    assert result["code"] == 0, result["stderr"] + result["traceback"]
    assert f"Checkpoint {damaged}/ckpt-4 is unreadable" in result["stdout"]
  assert f"Exported checkpoint {damaged}/ckpt-2 (step 2)" in runs["export_damaged"]["stdout"]
  assert checkpoint_inventory(damaged) == runs["inventory"]  # Read-only: nothing moved.


def test_serving_flags_a_broken_image_and_explains_bad_batches(runs):
  loaded = tf.saved_model.load(str(runs["paths"]["saved"]))
  serve, pixels = loaded.signatures["serving_default"], loaded.signatures["serve_images"]
  rng = np.random.default_rng(5)
  good = [_jpeg(rng) for _ in range(2)]
  out = serve(image_bytes=tf.constant([good[0], b"not an image", good[1]]))
  assert out["valid"].numpy().tolist() == [True, False, True]
  assert out["classes"].numpy()[1] == -1
  assert not out["probabilities"].numpy()[1].any()
  for i, row in ((0, 0), (1, 2)):  # The good rows equal one-image requests.
    alone = serve(image_bytes=tf.constant([good[i]]))
    np.testing.assert_allclose(out["logits"].numpy()[row], alone["logits"].numpy()[0], atol=1e-5)
  with pytest.raises(tf.errors.InvalidArgumentError, match="the batch is empty"):
    serve(image_bytes=tf.constant([], tf.string))
  image = tf.io.decode_jpeg(good[0]).numpy()
  for bad, message in ((image, "must be uint8 \\[N, H, W, 3\\]; got another rank"),
                       (image[None, ..., :1], "got another number of channels"),
                       (np.zeros((1, 0, 4, 3), np.uint8), "height and width >= 1"),
                       (np.zeros((0, 16, 16, 3), np.uint8), "the batch is empty")):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
      pixels(images=tf.constant(bad))
  assert pixels(images=tf.constant(image[None]))["valid"].numpy().tolist() == [True]


def test_version(capfd):
  result = run_main(capfd, cli.main, ["--version"])
  assert result.returncode == 0 and result.stdout.startswith("tpu-models 0.1.0 (Python ")
  assert "TensorFlow 2." in result.stdout
