"""Translation end to end on a tiny German->English corpus written here: loss, packing, BLEU, export."""

import os

import numpy as np
import pytest
import tensorflow as tf

import synthetic_checks
from helpers.translation import corpus, make_config, sentence_pairs  # noqa: F401  (corpus: a fixture)
from conftest import REPO
from helpers.text_exports import run_text_saved_model
from tpu_models import config as config_lib
from tpu_models import export
from tpu_models.text import inputs as text_lib
from tpu_models.registry import register_dataset
from tpu_models.text import translation
from tpu_models.task import create_task
from tpu_models.training import tpu_check
from tpu_models.training.trainer import Trainer

def _encode(vocab, sentences, length):
  return translation.encode_batch(vocab, tf.constant(sentences), length)


def test_loss_is_a_sum_over_real_tokens(corpus):
  task = create_task(make_config(corpus).task)
  model = task.build_model()
  assert model.vocab_size == task.vocab.vocab_size == 56  # Read from the vocabulary.
  de, en = zip(*corpus["train"][:3])
  features = {"inputs": _encode(task.vocab, de, 32), "targets": _encode(task.vocab, en, 32)}
  logits = model(features)
  loss_sum, tokens = task.loss({"targets": features["targets"]}, logits).loss
  assert float(tokens) == float(np.count_nonzero(features["targets"].numpy()))

  # The same by hand: smoothed targets (0.9 on the truth, 0.1 / 55 elsewhere) minus their entropy.
  log_probs = tf.nn.log_softmax(logits).numpy()
  targets = features["targets"].numpy()
  expected = 0.0
  for b, t in zip(*np.nonzero(targets)):
    soft = np.full(56, 0.1 / 55)
    soft[targets[b, t]] = 0.9
    expected += -(soft * log_probs[b, t]).sum() + (soft * np.log(soft)).sum()
  np.testing.assert_allclose(float(loss_sum), expected, rtol=1e-5)

  # Extra padding columns and all-padding rows (eval padding) add nothing.
  padded = {k: tf.pad(v, [[0, 2], [0, 8]]) for k, v in features.items()}
  padded_sum, padded_tokens = task.loss({"targets": padded["targets"]}, model(padded)).loss
  assert float(padded_tokens) == float(tokens)
  np.testing.assert_allclose(float(padded_sum), float(loss_sum), rtol=1e-5)


def test_packed_and_unpacked_give_the_same_loss(corpus):
  task = create_task(make_config(corpus).task)
  model = task.build_model()
  vocab = task.vocab
  pairs = corpus["train"][:6]
  examples = tf.data.Dataset.from_tensor_slices({
      "inputs": [de for de, _ in pairs], "targets": [en for _, en in pairs]}).map(
          lambda e: {k: vocab.encode(v) for k, v in e.items()})
  lengths = {"inputs": 64, "targets": 64}
  packed_rows = list(text_lib.pack_dataset(examples, lengths).as_numpy_iterator())
  assert len(packed_rows) < len(pairs)  # Several pairs per row.
  packed = {k: tf.constant(np.stack([r[k] for r in packed_rows])) for k in packed_rows[0]}
  unpacked = {k: tf.constant(np.stack([r[k] for r in text_lib.pad_to_length(
      examples, lengths).as_numpy_iterator()])) for k in ("inputs", "targets")}
  packed_sum, packed_tokens = task.loss({"targets": packed["targets"]}, model(packed)).loss
  sum_, tokens = task.loss({"targets": unpacked["targets"]}, model(unpacked)).loss
  assert float(packed_tokens) == float(tokens)
  np.testing.assert_allclose(float(packed_sum), float(sum_), rtol=1e-4)


def test_train_evaluate_bleu_and_export(corpus, tmp_path):
  config = make_config(corpus)
  model_dir = str(tmp_path / "run")
  trainer = Trainer(config, model_dir)
  metrics = trainer.train_and_evaluate()
  trainer.close()
  assert metrics["examples"] == 7  # 2 batches of 4, the second padded by one example.
  assert {"bleu", "chrf", "accuracy", "nll", "perplexity"} <= set(metrics)
  assert metrics["accuracy"] > 0.6, metrics  # Well above chance over 56 pieces.
  assert metrics["bleu"] > 10, metrics
  np.testing.assert_allclose(metrics["perplexity"], np.exp(metrics["nll"]), rtol=1e-6)

  # Eval batches of 1 (no padding) and 4 (one padding example): the same corpus BLEU.
  one = Trainer(make_config(corpus, ["task.eval_data.global_batch_size=1"]), model_dir)
  by_one = one.evaluate()
  one.close()
  assert by_one["examples"] == 7
  assert by_one["bleu"] == pytest.approx(metrics["bleu"], abs=1e-9)
  assert by_one["loss"] == pytest.approx(metrics["loss"], rel=1e-5)

  # Export, then translate in a fresh process (the tokenizer lives in the SavedModel).
  output = str(tmp_path / "saved")
  export.export_saved_model(config, model_dir, output)
  held_out = corpus["validation"][0]
  printed = run_text_saved_model(
      output, "out = m.signatures['serving_default'](sentences=tf.constant(sys.argv[2:]))\n"
      "for t in out['translations'].numpy(): print(t.decode())\n", held_out[0], "", "###  ξξ xyz")
  lines = printed.splitlines()
  assert len(lines) == 3, printed
  # The same translation as the task's own beam search on the trained weights.
  task, model = export.load_model(config, model_dir)
  assert lines[0] == task.translate_texts(model, [held_out[0]])[0]
  assert lines[0].startswith("The "), lines


@register_dataset("tiny_pairs_by_split", overwrite=True)
def _tiny_pairs_by_split(config, training, input_context):
  """German->English pairs whose split decides the text: 'train' or 'extra' (all "Ja." -> "Yes.")."""
  del training, input_context
  if config.split not in ("train", "extra"):
    raise ValueError(f"no split {config.split!r}")
  pairs = sentence_pairs()[:80] if config.split == "train" else [("Ja.", "Yes.")] * 5
  return tf.data.Dataset.from_tensor_slices({"inputs": [p[0] for p in pairs],
                                             "targets": [p[1] for p in pairs]})


def test_oversampling_draws_the_given_share_from_the_second_split(corpus):
  config = make_config(corpus, ["task.train_data.source=tiny_pairs_by_split",
                                "task.oversample_sentences=0.25", "task.sentences_split=extra",
                                "task.packing=false", "task.train_data.global_batch_size=50"])
  task = create_task(config.task)
  yes = translation.encode_batch(task.vocab, tf.constant(["Yes."]), 32).numpy()[0]
  rows = np.concatenate([f["targets"] for f, _ in
                         task.build_inputs("train").take(8).as_numpy_iterator()])
  share = np.mean([np.array_equal(row, yes) for row in rows])
  assert 0.15 < share < 0.35, share  # 400 rows drawn with p = 0.25.
  config = config_lib.override(config, ["task.sentences_split=sentences"])
  with pytest.raises(config_lib.ConfigError, match="sentences_split"):
    create_task(config.task).build_inputs("train")


@pytest.mark.parametrize("packing", [True, False])
def test_synthetic_inputs_have_the_real_batches_shapes(corpus, packing):
  config = make_config(corpus, [f"task.packing={str(packing).lower()}"])
  synthetic_checks.assert_synthetic_like_real(config, 56, ("inputs", "targets"))
  batches = list(create_task(config.task).synthetic_inputs("eval").take(3).as_numpy_iterator())
  assert [b[2].tolist() for b in batches] == [[1.0] * 4, [0.0] * 4, [0.0] * 4]  # Then padding.


def test_synthetic_source_trains_and_evaluates_without_data_or_vocabulary(corpus, tmp_path):
  metrics = synthetic_checks.train_and_evaluate_synthetic(
      make_config(corpus), str(tmp_path), 56, ["task.eval_bleu=false"])
  assert metrics["examples"] == 4 and np.isfinite(metrics["perplexity"])


def test_missing_vocabulary_names_the_command(corpus, tmp_path):
  config = make_config(corpus, [f"task.vocab_path={tmp_path / 'none.model'}"])
  task = create_task(config.task)
  with pytest.raises(FileNotFoundError, match="tpu-models vocab"):
    task.build_model()
  with pytest.raises(FileNotFoundError, match="task.vocab_path"):
    task.build_inputs("train")
  # With vocab_size in the model config the model builds, and `check` falls back to
  # synthetic inputs of the configured shapes.
  config = make_config(corpus, [f"task.vocab_path={tmp_path / 'none.model'}",
                                "task.model.vocab_size=56"])
  report = tpu_check.check_config(config)
  assert report.ready, report.format()
  assert report.compiled == ["train", "eval"]
  with pytest.raises(config_lib.ConfigError, match="vocab_size"):
    create_task(make_config(corpus, ["task.model.vocab_size=57"]).task).build_model()


def test_check_compiles_train_and_beam_search_eval(corpus):
  report = tpu_check.check_config(make_config(corpus))
  assert report.ready, report.format()
  assert report.compiled == ["train", "eval"]
  assert not [f for f in report.findings if f.kind == "input"], report.format()


@pytest.mark.parametrize("name", ["wmt14_ende_base", "wmt14_ende_big", "de_en_dictionary"])
def test_official_configs_load(name):
  config = config_lib.load_config(os.path.join(REPO, "official", "transformer", f"{name}.yaml"))
  assert config.task.name == "translation"
  assert config.task.model.params["vocab_size"] in (8000, 32000)
