"""A tiny German->English corpus of a word-for-word grammar, and the tiny translation
experiment on it (tests/text, tests/serving, tests/test_export_robustness.py)."""

import itertools
import random

import pytest

SUBJECTS = [("Der Hund", "The dog"), ("Die Katze", "The cat"), ("Das Kind", "The child"),
            ("Der Mann", "The man"), ("Die Frau", "The woman")]
VERBS = [("sieht", "sees"), ("mag", "likes"), ("hört", "hears"), ("sucht", "looks for")]
OBJECTS = [("den Ball", "the ball"), ("das Haus", "the house"), ("den Garten", "the garden"),
           ("die Blume", "the flower"), ("das Auto", "the car")]
TINY_TRANSFORMER = {"name": "transformer", "num_encoder_layers": 1, "num_decoder_layers": 1,
                    "hidden_size": 32, "num_heads": 2, "filter_size": 64, "dropout": 0.0,
                    "attention_dropout": 0.0, "activation_dropout": 0.0, "max_length": 64}


def sentence_pairs():
  """100 (German, English) sentences of a word-for-word grammar, in a fixed shuffled order."""
  pairs = [(f"{s} {v} {o}.", f"{es} {ev} {eo}.")
           for (s, es), (v, ev), (o, eo) in itertools.product(SUBJECTS, VERBS, OBJECTS)]
  random.Random(0).shuffle(pairs)
  return pairs


def write_corpus(root, vocab_size: int = 56) -> dict:
  """TSV files under the pathlib folder `root` (train: 3 x 80 pairs, validation: 7 pairs)
  and a SentencePiece vocabulary trained on train: {"root", "vocab", "train", "validation"}."""
  from tpu_models.text import inputs as text_lib
  pairs = sentence_pairs()
  train, validation = pairs[:80], pairs[80:87]
  (root / "train.tsv").write_text("".join(f"{de}\t{en}\n" for de, en in train * 3))
  (root / "validation.tsv").write_text("".join(f"{de}\t{en}\n" for de, en in validation))
  vocab = text_lib.train_sentencepiece([s for pair in train for s in pair], str(root / "vocab"),
                                       vocab_size=vocab_size, character_coverage=1.0)
  return {"root": root, "vocab": vocab, "train": train, "validation": validation}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """write_corpus in a fresh folder, once per test module."""
  return write_corpus(tmp_path_factory.mktemp("corpus"))


def make_config(corpus, extra=(), **task):  # pylint: disable=redefined-outer-name
  """The tiny translation experiment on `corpus` (150 steps, batch 8), `extra` --set
  overrides and `task` keys applied."""
  from tpu_models import config as config_lib
  data = {
      "task": {"name": "translation", "model": dict(TINY_TRANSFORMER),
               "vocab_path": corpus["vocab"],
               "max_input_length": 32, "max_target_length": 32, "max_decode_length": 32,
               "train_data": {"source": "tsv", "path": str(corpus["root"] / "train.tsv"),
                              "global_batch_size": 8, "seed": 1},
               "eval_data": {"source": "tsv", "path": str(corpus["root"] / "validation.tsv"),
                             "global_batch_size": 4}, **task},
      "trainer": {"train_steps": 150, "steps_per_loop": 50, "checkpoint_every": 150,
                  "optimizer": {"name": "adamw", "beta_2": 0.98},
                  "schedule": {"name": "inverse_sqrt", "base_lr": 0.01, "warmup_steps": 10},
                  "tensorboard": False},
      "runtime": {"strategy": "cpu", "seed": 3}}
  return config_lib.experiment_from_dict(data, list(extra))
