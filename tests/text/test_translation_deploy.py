"""LiteRT export of a tiny translator: the encoder and one decoder step as two signatures,
the search on the host: the Keras model's tokens, and the task's own BLEU through LiteRT."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_models import export
from tpu_models.errors import ConfigError
from tpu_models.text import translation
from tpu_models.training.trainer import Trainer

from helpers.translation import corpus, make_config  # pylint: disable=unused-import

STEPS = ["trainer.train_steps=40", "trainer.checkpoint_every=40", "trainer.steps_per_loop=20",
         "task.eval_bleu=false"]


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):  # pylint: disable=redefined-outer-name
  """A tiny translator trained 40 steps (its greedy decodes end with EOS) and its config."""
  model_dir = str(tmp_path_factory.mktemp("run"))
  trainer = Trainer(make_config(corpus, STEPS), model_dir)
  trainer.train()
  trainer.close()
  return model_dir


@pytest.mark.parametrize("beam_size", [1, 2])
def test_litert_steps_decode_as_the_keras_model(corpus, trained, tmp_path, beam_size):
  config = make_config(corpus, STEPS + [f"task.beam_size={beam_size}"])
  output = str(tmp_path / "litert")
  export.export_deployment(config, trained, output, format_name="litert")
  with open(os.path.join(output, export.EXPORT_JSON)) as f:
    record = json.load(f)
  assert record["builtin_ops_only"] and record["select_tf_ops"] == [], record["ops"]
  assert set(record["signatures"]) == {"encode", "decode_step"}
  assert any("SentencePiece" in line for line in record["outside_graph"])
  # The export's check: its searched tokens equal the unconverted steps' on every sentence.
  assert record["agreement"]["unit"] == "sentences' tokens of eval"
  assert record["agreement"]["fraction"] == 1.0 and record["agreement"]["total"] == 7
  runner = export.ExportRunner(output)
  assert runner.runtime.startswith(export.litert_runtime())

  task, model = export.load_model(config, trained)
  sentences = [de for de, _ in corpus["validation"][:3]]
  inputs = translation.encode_batch(task.vocab, tf.constant(sentences), task.eval_input_length)
  expected = model.translate(inputs, beam_size=beam_size, alpha=config.task.alpha,
                             max_decode_length=task.max_decode_length)["ids"].numpy()
  assert (expected == 1).sum() == 0 and (expected[:, 0] > 2).all()  # Real tokens, EOS cut.
  deployed = np.stack([task._deployed_search(runner, row) for row in inputs.numpy()])  # pylint: disable=protected-access
  np.testing.assert_array_equal(deployed, expected)

  if beam_size == 1:
    # The task's own BLEU through LiteRT is the evaluation's (same tokens, same scorer).
    evaluation = make_config(corpus, STEPS[:3] + ["task.beam_size=1"])
    trainer = Trainer(evaluation, trained)
    reference = trainer.evaluate()
    trainer.close()
    result = export.evaluate_export(output, evaluation, split="eval")
    assert result["metrics"]["examples"] == 7
    assert result["metrics"]["bleu"] == pytest.approx(reference["bleu"], abs=1e-6)
    assert result["metrics"]["chrf"] == pytest.approx(reference["chrf"], abs=1e-6)
    # The SavedModel (strings in and out, its search in the graph) by the same command.
    saved = str(tmp_path / "saved")
    export.export_saved_model(evaluation, trained, saved)
    by_saved = export.evaluate_export(saved, evaluation, split="eval")
    assert by_saved["format"] == "saved_model"
    assert by_saved["metrics"] == pytest.approx(result["metrics"], abs=1e-6)


def test_onnx_steps_decode_as_the_keras_model(corpus, trained, tmp_path):
  """ONNX (tf2onnx, onnxruntime): one file per signature, the search on the host."""
  pytest.importorskip("tf2onnx")
  pytest.importorskip("onnxruntime")
  config = make_config(corpus, STEPS + ["task.beam_size=2"])
  output = str(tmp_path / "onnx")
  export.export_deployment(config, trained, output, format_name="onnx")
  with open(os.path.join(output, export.EXPORT_JSON)) as f:
    record = json.load(f)
  assert record["files"] == {"encode": "encode.onnx", "decode_step": "decode_step.onnx"}
  assert record["agreement"]["fraction"] == 1.0 and record["agreement"]["total"] == 7
  runner = export.ExportRunner(output)
  task, model = export.load_model(config, trained)
  sentences = [de for de, _ in corpus["validation"][:3]]
  inputs = translation.encode_batch(task.vocab, tf.constant(sentences), task.eval_input_length)
  expected = model.translate(inputs, beam_size=2, alpha=config.task.alpha,
                             max_decode_length=task.max_decode_length)["ids"].numpy()
  deployed = np.stack([task._deployed_search(runner, row) for row in inputs.numpy()])  # pylint: disable=protected-access
  np.testing.assert_array_equal(deployed, expected)


def test_int8_is_refused_naming_float32(corpus, trained, tmp_path):
  """Issue 28 item 3: int8 of the translator is refused in one line with the reason,
  before anything is converted or written."""
  with pytest.raises(ConfigError, match=r"float32 only: an int8 decode_step .* is not built\. "
                                        r"Export --format litert \(float32\) or onnx") as error:
    export.export_deployment(make_config(corpus, STEPS), trained, str(tmp_path / "int8"),
                             format_name="litert-int8")
  assert "\n" not in str(error.value) and not os.path.exists(tmp_path / "int8")
