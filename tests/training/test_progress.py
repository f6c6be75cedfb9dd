"""Reporter: a dead reader of stdout stops the printing, never the run or its records."""

import json
import os

from tpu_models.training.progress import METRICS_FILE, Reporter


class _Stream:
  """A piped stdout; `broken`: its reader has gone (a killed driver), so writes raise as in CPython."""

  def __init__(self, broken=False):
    self.broken, self.writes, self.text = broken, 0, ""

  def isatty(self):
    return False

  def write(self, text):
    self.writes += 1
    if self.broken:
      raise BrokenPipeError(32, "Broken pipe")
    self.text += text

  def flush(self):
    pass


def test_a_broken_stdout_pipe_stops_printing_but_keeps_every_metrics_row(tmp_path):
  stream = _Stream(broken=True)
  reporter = Reporter(str(tmp_path), total_steps=200, tensorboard=False, stream=stream)
  reporter.train_progress(100, {"loss": 1.5}, lr=0.1, examples_per_sec=8.0, seconds_per_step=1.0)
  reporter.train_progress(200, {"loss": 1.25}, lr=0.1, examples_per_sec=8.0, seconds_per_step=1.0)
  reporter.eval_result(200, {"AP": 0.5}, seconds=2.0)
  reporter.message("SIGTERM: checkpoint saved at step 200.")
  reporter.close()

  with open(os.path.join(tmp_path, METRICS_FILE)) as f:
    rows = [json.loads(line) for line in f]
  assert [(r["split"], r["step"]) for r in rows] == [("train", 100), ("train", 200), ("eval", 200)]
  assert rows[1]["loss"] == 1.25 and rows[2]["AP"] == 0.5
  assert stream.writes == 1  # Tried once; after the broken pipe it stops trying.


def test_a_live_stream_gets_every_line(tmp_path):
  stream = _Stream()
  reporter = Reporter(str(tmp_path), total_steps=100, tensorboard=False, stream=stream)
  reporter.train_progress(100, {"loss": 1.5}, lr=0.1, examples_per_sec=8.0, seconds_per_step=1.0)
  reporter.message("done")
  reporter.close()
  lines = stream.text.splitlines()
  assert lines[0].startswith("step 100/100 | loss 1.5000") and lines[1] == "done"
