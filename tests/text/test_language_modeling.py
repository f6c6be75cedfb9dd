"""Language modeling end to end on tiny English text written here: loss, perplexity, sampling, export."""

import itertools
import os
import random

import numpy as np
import pytest
import tensorflow as tf

import synthetic_checks
from conftest import REPO
from helpers.text_exports import run_text_saved_model
from tpu_models import cli
from tpu_models import config as config_lib
from tpu_models import export
from tpu_models.text import inputs as text_lib
from tpu_models.task import create_task
from tpu_models.training import tpu_check
from tpu_models.training.trainer import Trainer

SUBJECTS = ["The dog", "The cat", "The child", "The man", "The woman"]
VERBS = ["sees", "likes", "hears", "looks for"]
OBJECTS = ["the ball", "the house", "the garden", "the flower", "the car"]
TINY_LM = {"name": "transformer_lm", "num_layers": 1, "hidden_size": 32, "num_heads": 2,
           "filter_size": 64, "dropout": 0.0, "attention_dropout": 0.0,
           "activation_dropout": 0.0, "max_length": 64}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """English lines (train: 3 x 80, validation: 7) as a text file and as the target side of a TSV."""
  root = tmp_path_factory.mktemp("lm_corpus")
  sentences = [f"{s} {v} {o}." for s, v, o in itertools.product(SUBJECTS, VERBS, OBJECTS)]
  random.Random(0).shuffle(sentences)
  train, validation = sentences[:80], sentences[80:87]
  (root / "train.txt").write_text("\n".join(train * 3) + "\n\n")  # A blank line is skipped.
  (root / "validation.txt").write_text("\n".join(validation) + "\n")
  (root / "train.tsv").write_text("".join(f"de {i}\t{s}\n" for i, s in enumerate(train * 3)))
  vocab = text_lib.train_sentencepiece(train, str(root / "vocab"), vocab_size=34,
                                       character_coverage=1.0)
  return {"root": root, "vocab": vocab, "train": train, "validation": validation}


def make_config(corpus, extra=()):
  data = {
      "task": {"name": "language_modeling", "model": dict(TINY_LM), "vocab_path": corpus["vocab"],
               "text_feature": "text", "max_length": 32, "unigram_baseline": True,
               "prompt_max_length": 16, "sample_max_new_tokens": 24,
               "train_data": {"source": "text_lines", "path": str(corpus["root"] / "train.txt"),
                              "global_batch_size": 8, "seed": 1},
               "eval_data": {"source": "text_lines",
                             "path": str(corpus["root"] / "validation.txt"),
                             "global_batch_size": 4}},
      "trainer": {"train_steps": 120, "steps_per_loop": 40, "checkpoint_every": 120,
                  "optimizer": {"name": "adamw"},
                  "schedule": {"name": "constant", "base_lr": 0.01, "warmup_steps": 10},
                  "tensorboard": False},
      "runtime": {"strategy": "cpu", "seed": 5}}
  return config_lib.experiment_from_dict(data, list(extra))


def test_loss_perplexity_and_unigram_baseline(corpus, tmp_path):
  config = make_config(corpus)
  trainer = Trainer(config, str(tmp_path / "run"))
  metrics = trainer.train_and_evaluate()
  task = trainer.task
  assert metrics["examples"] == 7
  np.testing.assert_allclose(metrics["perplexity"], np.exp(metrics["loss"]), rtol=1e-6)

  # The unigram baseline by hand: add-one counts of the training tokens (EOS included),
  # scored on the validation tokens.
  vocab = task.vocab
  counts = np.ones(vocab.vocab_size)
  counts[text_lib.PAD_ID] = 0
  np.add.at(counts, vocab.encode(corpus["train"] * 3).flat_values.numpy(), 1)
  log_probs = np.log(counts / counts.sum())
  held_out = vocab.encode(corpus["validation"]).flat_values.numpy()
  expected = np.exp(-log_probs[held_out].mean())
  np.testing.assert_allclose(metrics["unigram_perplexity"], expected, rtol=1e-4)
  assert metrics["perplexity"] < metrics["unigram_perplexity"] / 2, metrics

  # Greedy sampling is deterministic and continues the grammar; top-k with a seed is repeatable.
  model = trainer.model
  greedy = task.sample(model, ["The dog", "", "The woman likes"], max_new_tokens=16)
  assert greedy == task.sample(model, ["The dog", "", "The woman likes"], max_new_tokens=16)
  assert greedy[0].startswith("The dog ") and greedy[2].startswith("The woman likes ")
  assert greedy[0].split()[2] in {v.split()[0] for v in VERBS}, greedy
  sampled = task.sample(model, ["The cat"] * 4, top_k=5, temperature=1.0, seed=7)
  assert sampled == task.sample(model, ["The cat"] * 4, top_k=5, temperature=1.0, seed=7)
  assert all(s.startswith("The cat") for s in sampled)
  trainer.close()


def test_packed_and_unpacked_give_the_same_loss(corpus):
  task = create_task(make_config(corpus).task)
  model = task.build_model()
  examples = tf.data.Dataset.from_tensor_slices({"targets": corpus["train"][:6]}).map(
      lambda e: {"targets": task.vocab.encode(e["targets"])})
  packed_rows = list(text_lib.pack_dataset(examples, {"targets": 64}).as_numpy_iterator())
  assert len(packed_rows) < 6
  packed = {k: tf.constant(np.stack([r[k] for r in packed_rows])) for k in packed_rows[0]}
  unpacked = tf.constant(np.stack([r["targets"] for r in text_lib.pad_to_length(
      examples, {"targets": 64}).as_numpy_iterator()]))
  packed_sum, packed_tokens = task.loss({"targets": packed["targets"]}, model(packed)).loss
  sum_, tokens = task.loss({"targets": unpacked}, model({"targets": unpacked})).loss
  assert float(packed_tokens) == float(tokens) == float(np.count_nonzero(unpacked.numpy()))
  np.testing.assert_allclose(float(packed_sum), float(sum_), rtol=1e-4)


def test_one_side_of_a_parallel_source(corpus):
  config = make_config(corpus, ["task.train_data.source=tsv", "task.text_feature=targets",
                                f"task.train_data.path={corpus['root'] / 'train.tsv'}",
                                "task.packing=false"])
  task = create_task(config.task)
  features, labels = next(iter(task.build_inputs("train")))
  texts = task.vocab.decode(labels["targets"]).numpy()
  assert all(t.decode() in corpus["train"] for t in texts)  # English side only.
  bad = create_task(make_config(corpus, ["task.text_feature=english"]).task)
  with pytest.raises(config_lib.ConfigError, match="text_feature"):
    bad.build_inputs("eval")


def test_export_sample_command_and_check(corpus, tmp_path, capsys):
  config = make_config(corpus, ["trainer.train_steps=40", "task.unigram_baseline=false"])
  model_dir = str(tmp_path / "run")
  trainer = Trainer(config, model_dir)
  trainer.train()
  trainer.close()
  output = str(tmp_path / "saved")
  export.export_saved_model(config, model_dir, output)
  printed = run_text_saved_model(output, (
      "for name in ('serving_default', 'sample_top_k'):\n"
      "  out = m.signatures[name](prompts=tf.constant(['The dog', '']))\n"
      "  print(name, '|'.join(t.decode() for t in out['texts'].numpy()))\n"))
  lines = dict(line.split(" ", 1) for line in printed.splitlines())
  task, model = export.load_model(config, model_dir)
  expected = task.sample(model, ["The dog", ""], max_new_tokens=24)
  assert lines["serving_default"] == "|".join(expected)
  assert lines["sample_top_k"].startswith("The dog")

  # `tpu-models sample` with a YAML of this config.
  yaml_path = tmp_path / "lm.yaml"
  config_lib.dump_config(config, str(yaml_path))
  capsys.readouterr()
  code = cli.main(["sample", str(yaml_path), "--model-dir", model_dir, "--prompt", "The dog",
                   "--max-new-tokens", "24"])
  assert code == 0
  assert capsys.readouterr().out.strip().splitlines()[-1] == expected[0]

  report = tpu_check.check_config(config)
  assert report.ready and report.compiled == ["train", "eval"], report.format()


@pytest.mark.parametrize("packing", [True, False])
def test_synthetic_inputs_have_the_real_batches_shapes(corpus, packing):
  config = make_config(corpus, [f"task.packing={str(packing).lower()}"])
  synthetic_checks.assert_synthetic_like_real(config, 34, ("targets",))


def test_synthetic_source_trains_and_evaluates_without_data_or_vocabulary(corpus, tmp_path):
  metrics = synthetic_checks.train_and_evaluate_synthetic(
      make_config(corpus), str(tmp_path), 34, ["task.unigram_baseline=false"])
  assert metrics["examples"] == 4 and np.isfinite(metrics["perplexity"])


def test_official_lm_config_loads():
  config = config_lib.load_config(
      os.path.join(REPO, "official", "transformer", "de_en_dictionary_lm.yaml"))
  assert config.task.name == "language_modeling"
  assert config.task.text_feature == "targets"
