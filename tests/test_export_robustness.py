"""Exported models reloaded in a FRESH process never crash on bad input: a detector fed a
corrupt image flags it (valid False, no detections) and still detects in the good one; a
translator given empty, blank, over-long and garbage strings (invalid UTF-8, control bytes,
emoji, punctuation only) answers each, and still translates a held-out sentence."""

import base64
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tpu_models import export
from tpu_models.vision.detection import inputs as detection_data
from tpu_models.training.trainer import Trainer

from helpers.translation import make_config, write_corpus
from helpers.detection import trained_tiny_detector

# Runs in a fresh Python: loads both SavedModels and serves the inputs of a JSON file
# (base64 strings: the translator's inputs are not all UTF-8), printing one JSON line.
SERVE_SCRIPT = r"""
import base64, json, sys
import tensorflow as tf, tensorflow_text  # noqa: F401 (the translator's tokenizer ops)
request = json.load(open(sys.argv[1]))
out = {}
detector = tf.saved_model.load(request["detector"])
serve = detector.signatures["serving_default"]
images = [base64.b64decode(b) for b in request["images"]]
result = serve(image_bytes=tf.constant(images))
out["detector"] = {k: (v.numpy().astype(str) if v.dtype == tf.string else v.numpy()).tolist()
                   for k, v in result.items()}
try:
  serve(image_bytes=tf.constant([], tf.string))
  out["empty_batch"] = "no error"
except tf.errors.InvalidArgumentError as e:
  out["empty_batch"] = e.message
pixels = detector.signatures["serve_images"](images=tf.io.decode_jpeg(images[0])[None])
out["pixels_valid"] = pixels["valid"].numpy().tolist()
out["still_serving"] = int(serve(image_bytes=tf.constant(images[:1]))["num_detections"][0])

translator = tf.saved_model.load(request["translator"])
translate = translator.signatures["serving_default"]
sentences = [base64.b64decode(s) for s in request["sentences"]]
batch = translate(sentences=tf.constant(sentences))
out["translations"] = [t.decode("utf-8") for t in batch["translations"].numpy()]
out["scores"] = batch["scores"].numpy().tolist()
out["one_by_one"] = [translate(sentences=tf.constant([s]))["translations"].numpy()[0].decode()
                     for s in sentences]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
  """(config, model_dir, validation JPEG bytes) of a detector trained for a few steps."""
  config, model_dir, data_dir = trained_tiny_detector(tmp_path_factory, 10)
  validation = os.path.join(data_dir, "images", "validation")
  with open(os.path.join(validation, sorted(os.listdir(validation))[0]), "rb") as f:
    return config, model_dir, f.read()


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
  """(config, model_dir, held-out (German, English)) of the tiny translation model."""
  corpus = write_corpus(tmp_path_factory.mktemp("corpus"))
  config = make_config(corpus, ["task.eval_bleu=false"])
  model_dir = str(tmp_path_factory.mktemp("translator"))
  trainer = Trainer(config, model_dir)
  trainer.train()
  trainer.close()
  return config, model_dir, corpus["validation"][0]


def test_exported_models_survive_bad_inputs_in_a_fresh_process(detector, translator, tmp_path):
  det_config, det_dir, jpeg = detector
  tr_config, tr_dir, (german, english) = translator
  det_saved = export.export_saved_model(det_config, det_dir, str(tmp_path / "detector"))
  tr_saved = export.export_saved_model(tr_config, tr_dir, str(tmp_path / "translator"))
  assert tr_config.task.max_input_length == 32
  sentences = [
      german.encode(),
      b"",
      b" \t\n  ",
      (" ".join([german] * 30)).encode(),  # ~200 tokens: cut to max_input_length (32).
      bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8)),  # Random bytes.
      b"Der Hund \xff\xfe\xc3( sieht",  # Invalid UTF-8 inside a sentence.
      b"\x00\x01\x02",
      "😀🎉👍 🐶".encode(),
      b"?!.,;:-- ...",
  ]
  request = tmp_path / "request.json"
  request.write_text(json.dumps({
      "detector": det_saved, "translator": tr_saved,
      "images": [base64.b64encode(b).decode() for b in (jpeg, b"\xff\xd8 not really a jpeg")],
      "sentences": [base64.b64encode(s).decode() for s in sentences]}))
  result = subprocess.run([sys.executable, "-c", SERVE_SCRIPT, str(request)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads(result.stdout.splitlines()[-1])

  # Detector: the good image detected (as the Keras model does), the corrupt one flagged.
  served = out["detector"]
  assert served["valid"] == [True, False]
  assert served["reason"] == ["", "not a JPEG, PNG, GIF, BMP or WebP image (unknown format)"]
  count = served["num_detections"][0]
  assert count > 0 and served["num_detections"][1] == 0
  assert np.all(np.array(served["detection_boxes"][1]) == 0)
  assert np.all(np.array(served["detection_scores"][1]) == 0)
  assert np.all(np.array(served["detection_classes"][1]) == -1)
  task, model = export.load_model(det_config, det_dir)
  image, info = detection_data.resize_and_pad(tf.constant(jpeg), tf.zeros([0, 4]), 64)[::3]
  expected = task.detections(model(image[None], training=False))
  assert count == int(expected["num_detections"][0])
  np.testing.assert_allclose(served["detection_scores"][0], expected["scores"].numpy()[0],
                             atol=1e-4)
  np.testing.assert_allclose(
      np.array(served["detection_boxes"][0])[:count],
      detection_data.to_original_pixels(expected["boxes"], info[None]).numpy()[0, :count],
      atol=1e-2)
  assert "batch is empty" in out["empty_batch"]  # An error that says why; the server lives on.
  assert out["pixels_valid"] == [True] and out["still_serving"] == count

  # Translator: every input answered, in the batch and alone, never a crash.
  translations = out["translations"]
  assert len(translations) == len(sentences) and out["one_by_one"] == translations
  tr_task, tr_model = export.load_model(tr_config, tr_dir)
  assert translations[0] == tr_task.translate_texts(tr_model, [german])[0]
  assert translations[0].startswith("The "), (translations[0], english)
  assert translations[1] == translations[2] == "" and out["scores"][1] == out["scores"][2] == 0
  # Cut to 32 tokens: the same as translating only its first 31 pieces (plus EOS).
  vocab = tr_task.vocab
  pieces = vocab.encode(tf.constant(sentences[3].decode())).numpy()
  assert len(pieces) > 32
  first = vocab.decode(tf.constant(pieces[:31], tf.int32)).numpy().decode()
  assert translations[3] == tr_task.translate_texts(tr_model, [first])[0]
  assert all(np.isfinite(out["scores"]))
