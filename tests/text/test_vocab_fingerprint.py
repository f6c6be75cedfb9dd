"""A trained translator's vocabulary is fingerprinted: another one is refused, through the CLI.

Two vocabularies of the same size learned from different sentences give ids of
the same range and different meanings: resuming, evaluating or exporting with
the second must fail with one line naming both files, and `tpu-models vocab`
must not overwrite a vocabulary that runs depend on.
"""

import json

import pytest
import yaml

from helpers.translation import TINY_TRANSFORMER, sentence_pairs, write_corpus
from conftest import run_main
from tpu_models import cli
from tpu_models.text import inputs as text_lib

VOCAB_SIZE = 56


@pytest.fixture
def run_cli(capfd, monkeypatch):
  """`tpu-models ARGS` run from `cwd`, in this process (cli.main is the console script's entry)."""

  def run(*args, cwd):
    monkeypatch.chdir(cwd)
    return run_main(capfd, cli.main, args)

  return run


def _error_line(result):
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  return lines[-1] if lines else ""


def test_another_vocabulary_of_the_same_size_is_refused(corpus_dir, run_cli):
  root, first = corpus_dir
  # The same size, other sentences (the English side reversed word by word): other pieces.
  sentences = [" ".join(reversed(s.split())) for pair in sentence_pairs()[:80]
               for s in pair]
  second = text_lib.train_sentencepiece(sentences, str(root / "other"), vocab_size=VOCAB_SIZE,
                                        character_coverage=1.0)
  copy = root / "copy.model"  # The same contents at another path: accepted.
  copy.write_bytes(open(first, "rb").read())

  experiment = root / "tiny.yaml"
  experiment.write_text(yaml.safe_dump(_experiment(root, first)))
  model_dir = root / "run"
  common = ("--model-dir", str(model_dir), "--mode", "train", "--set", "trainer.train_steps=4",
            "--set", "trainer.steps_per_loop=2", "--set", "trainer.checkpoint_every=2")
  trained = run_cli("train", str(experiment), *common, cwd=root)
  assert trained.returncode == 0, trained.stderr[-2000:]
  recorded = json.loads((model_dir / "fingerprints.json").read_text())
  assert recorded["task.vocab_path"]["path"] == first
  assert len(recorded["task.vocab_path"]["sha256"]) == 64

  with_other = ("--set", f"task.vocab_path={second}")
  resumed = run_cli("train", str(experiment), *common, "--set", "trainer.train_steps=6",
                    *with_other, cwd=root)
  evaluated = run_cli("evaluate", str(experiment), "--model-dir", str(model_dir), *with_other,
                      cwd=root)
  exported = run_cli("export", str(experiment), "--model-dir", str(model_dir), "--output",
                     str(root / "export"), *with_other, cwd=root)
  for result in (resumed, evaluated, exported):
    assert result.returncode == 2, result.stderr[-2000:]
    line = _error_line(result)
    assert "task.vocab_path" in line and second in line and first in line, line
    # Refused before any restore: no TensorFlow warning per unrestored variable before it
    # (issue 28: ~20 of them preceded the line).
    before = [l for l in result.stderr.splitlines()[:-1] if "checkpoint" in l.lower()]
    assert not before, before[:3]
    assert "Resumed from" not in result.stdout
  assert not (root / "export").exists()
  # Nothing was trained with the other vocabulary: the run still ends at step 4.
  assert sorted(p.name for p in model_dir.glob("ckpt-*.index")) == ["ckpt-2.index", "ckpt-4.index"]

  same = run_cli("train", str(experiment), *common, "--set", "trainer.train_steps=6",
                 "--set", f"task.vocab_path={copy}", cwd=root)
  assert same.returncode == 0, same.stderr[-2000:]
  assert (model_dir / "ckpt-6.index").exists()


def test_vocab_refuses_to_overwrite_without_the_flag(corpus_dir, run_cli):
  root, first = corpus_dir
  prefix = first[:-len(".model")]
  before = open(first, "rb").read()
  args = ("vocab", "tsv", "--path", str(root / "train.tsv"), "--output", prefix,
          "--vocab-size", str(VOCAB_SIZE), "--character-coverage", "1.0")
  refused = run_cli(*args, cwd=root)
  assert refused.returncode == 2
  assert "--overwrite" in _error_line(refused) and prefix in _error_line(refused)
  assert open(first, "rb").read() == before
  # Another vocabulary (a smaller one, from the English side only) replaces it with the flag.
  replaced = run_cli(*args[:-4], "--vocab-size", "30", "--character-coverage", "1.0",
                     "--fields", "targets", "--overwrite", cwd=root)
  assert replaced.returncode == 0, replaced.stderr[-2000:]
  assert open(first, "rb").read() != before


def _experiment(root, vocab):
  model = dict(TINY_TRANSFORMER)
  return {
      "task": {"name": "translation", "model": model, "vocab_path": vocab,
               "max_input_length": 32, "max_target_length": 32, "max_decode_length": 32,
               "eval_bleu": False,
               "train_data": {"source": "tsv", "path": str(root / "train.tsv"),
                              "global_batch_size": 8, "seed": 1},
               "eval_data": {"source": "tsv", "path": str(root / "validation.tsv"),
                             "global_batch_size": 4}},
      "trainer": {"optimizer": {"name": "adamw"},
                  "schedule": {"name": "constant", "base_lr": 0.001}, "tensorboard": False},
      "runtime": {"strategy": "cpu", "seed": 3}}


@pytest.fixture
def corpus_dir(tmp_path):
  """(directory with train.tsv / validation.tsv, the vocabulary trained on train)."""
  return tmp_path, write_corpus(tmp_path, VOCAB_SIZE)["vocab"]
