"""A text model's SavedModel run as a user would: a fresh Python process, no tpu_models."""

import os
import subprocess
import sys


def run_text_saved_model(export_dir: str, body: str, *args: str) -> str:
  """Runs `body` (Python source) in a fresh process in which tensorflow_text is imported (the
  tokenizer's ops) and `m` is the SavedModel at `export_dir` (tf.saved_model.load);
  sys.argv[2:] are `args`. Asserts it exits 0; returns what it printed."""
  script = ("import sys, tensorflow as tf, tensorflow_text\n"
            "m = tf.saved_model.load(sys.argv[1])\n" + body)
  result = subprocess.run([sys.executable, "-c", script, export_dir, *args], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout
