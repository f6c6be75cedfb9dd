"""The CLI's quiet TensorFlow start-up and `tpu-models benchmark --model-dir`."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from tpu_models import cli

TESTS = os.path.dirname(os.path.abspath(__file__))


def _cli(*args, **env):
  environment = {k: v for k, v in os.environ.items()
                 if k not in ("TF_CPP_MIN_LOG_LEVEL", "TPU_MODELS_TF_STARTUP_LOGS")}
  environment.update(PYTHONPATH=os.pathsep.join([TESTS, REPO]), **env)
  return subprocess.run([sys.executable, "-m", "tpu_models.cli", *args], cwd=TESTS,
                        env=environment, capture_output=True, text=True, timeout=300)


def test_start_up_filter_drops_whole_notice_lines_only():
  notices = cli._STARTUP_NOTICES + cli._NO_GPU_NOTICES
  stderr = (b"WARNING: All log messages before absl::InitializeLog() is called are written to "
            b"STDERR\n"
            b"I0000 00:00:17.1 1 onednn.cc:1] oneDNN custom operations are on. You may see ...\n"
            b"E0000 real error: could not open libfoo.so\n"
            b"I0000 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not "
            b"be used.\n"
            b"last line without newline")
  assert cli._without_notices(stderr, notices) == (
      b"E0000 real error: could not open libfoo.so\nlast line without newline")


@pytest.mark.skipif(cli._has_nvidia_device(), reason="the CUDA notices are kept where a GPU is")
def test_start_up_notices_are_dropped_and_everything_else_kept(tmp_path):
  # Which notices TensorFlow prints depends on the CPU (oneDNN's only on some): whichever
  # this machine shows with the filter off must be gone with it on.
  shown = _cli("list", "tasks", TPU_MODELS_TF_STARTUP_LOGS="1")
  assert shown.returncode == 0, shown.stderr
  notices = cli._STARTUP_NOTICES + cli._NO_GPU_NOTICES
  quiet = _cli("train", "toy.yaml", "--import", "toy_task", "--model-dir", str(tmp_path / "run"),
               "--set", "trainer.train_steps=10")
  assert quiet.returncode == 0, quiet.stderr
  assert "final eval: loss" in quiet.stdout
  for notice in notices:
    assert notice not in quiet.stderr, (notice, shown.stderr)
  quiet_list = _cli("list", "tasks")
  assert quiet_list.returncode == 0 and quiet_list.stdout == shown.stdout
  for notice in notices:
    assert notice not in quiet_list.stderr, (notice, shown.stderr)
  # A real error on stderr still gets through.
  bad = _cli("train", "toy.yaml", "--import", "toy_task", "--set", "trainer.trian_steps=1")
  assert bad.returncode == 2 and "trainer.trian_steps" in bad.stderr


def test_benchmark_writes_to_the_given_model_dir(tmp_path, capsys):
  model_dir = tmp_path / "bench"
  assert cli.main(["benchmark", os.path.join(TESTS, "toy.yaml"), "--import", "toy_task",
                   "--model-dir", str(model_dir), "--steps", "3", "--warmup", "2"]) == 0
  assert "examples/s" in capsys.readouterr().out
  rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if r["split"] == "train"] == [2, 5]
