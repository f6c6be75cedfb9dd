"""The CLI's quiet TensorFlow start-up and `tpu-models benchmark --model-dir`."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from tpu_models import cli, startup

TESTS = os.path.dirname(os.path.abspath(__file__))


def _environment(**env):
  environment = {k: v for k, v in os.environ.items()
                 if k not in ("TF_CPP_MIN_LOG_LEVEL", "TPU_MODELS_TF_STARTUP_LOGS")}
  environment.update(PYTHONPATH=os.pathsep.join([TESTS, REPO]), **env)
  return environment


def _cli(*args, **env):
  return subprocess.run([sys.executable, "-m", "tpu_models.cli", *args], cwd=TESTS,
                        env=_environment(**env), capture_output=True, text=True, timeout=300)


# Commands one after the other in ONE fresh child, as the console script runs each
# (`cli.main(argv)`): only the first imports TensorFlow (through the filter, as in a child
# of its own); the next ones write to the file descriptors the filter gave back. Nothing
# redirects them between commands (that could hide where the filter left fd 2): a marker
# line with the exit code, written to both after each command, separates their output.
COMMANDS = r"""
import json, os, sys
from entry_points import exit_code_of  # tests/, the working directory
from tpu_models import cli, startup
mark, commands = sys.argv[1], json.loads(sys.argv[2])
for argv in commands:
  code = exit_code_of(cli.main, argv)
  for fd in (1, 2):
    os.write(fd, f"{mark} {code}@@\n".encode())
"""
_MARK = "@@tpu-models command ended, exit code"


def _cli_in_one_child(*commands):
  """A subprocess.CompletedProcess for each command (an argv list), all run by COMMANDS."""
  child = subprocess.run([sys.executable, "-c", COMMANDS, _MARK, json.dumps(commands)],
                         cwd=TESTS, env=_environment(), capture_output=True, text=True,
                         timeout=300)
  assert child.returncode == 0, child.stderr[-3000:]
  ended = re.escape(_MARK) + r" (-?\d+)@@\n"
  out, err = re.split(ended, child.stdout), re.split(ended, child.stderr)
  assert len(out) == len(err) == 2 * len(commands) + 1 and out[1::2] == err[1::2], child
  return [subprocess.CompletedProcess(argv, int(code), stdout, stderr)
          for argv, stdout, code, stderr in zip(commands, out[0::2], out[1::2], err[0::2])]


def test_start_up_filter_drops_whole_notice_lines_only():
  notices = startup.STARTUP_NOTICES + startup.NO_GPU_NOTICES
  stderr = (b"WARNING: All log messages before absl::InitializeLog() is called are written to "
            b"STDERR\n"
            b"I0000 00:00:17.1 1 onednn.cc:1] oneDNN custom operations are on. You may see ...\n"
            b"E0000 real error: could not open libfoo.so\n"
            b"I0000 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not "
            b"be used.\n"
            b"last line without newline")
  assert startup.without_notices(stderr, notices) == (
      b"E0000 real error: could not open libfoo.so\nlast line without newline")


@pytest.mark.skipif(startup.has_nvidia_device(), reason="the CUDA notices are kept where a GPU is")
def test_start_up_notices_are_dropped_and_everything_else_kept(tmp_path):
  # Which notices TensorFlow prints depends on the CPU (oneDNN's only on some): whichever
  # this machine shows with the filter off must be gone with it on.
  shown = _cli("list", "tasks", TPU_MODELS_TF_STARTUP_LOGS="1")
  assert shown.returncode == 0, shown.stderr
  notices = startup.STARTUP_NOTICES + startup.NO_GPU_NOTICES
  quiet = _cli("train", "toy.yaml", "--import", "toy_task", "--model-dir", str(tmp_path / "run"),
               "--set", "trainer.train_steps=10")
  assert quiet.returncode == 0, quiet.stderr
  assert "final eval: loss" in quiet.stdout
  for notice in notices:
    assert notice not in quiet.stderr, (notice, shown.stderr)
  # The list first (TensorFlow imported through the filter), then the config error on the
  # stderr the filter gave back: one child, not two.
  quiet_list, bad = _cli_in_one_child(
      ["list", "tasks"],
      ["train", "toy.yaml", "--import", "toy_task", "--set", "trainer.trian_steps=1"])
  assert quiet_list.returncode == 0 and quiet_list.stdout == shown.stdout
  for notice in notices:
    assert notice not in quiet_list.stderr, (notice, shown.stderr)
  # A real error on stderr still gets through.
  assert bad.returncode == 2 and "trainer.trian_steps" in bad.stderr


LIBRARY_USE = r"""
import sys
from tpu_models import config, create_model
config.load_config(sys.argv[1], ["task.model.name=resnet18"])
print("built", create_model("resnet18", num_classes=3).count_params() > 0)
"""


@pytest.mark.skipif(startup.has_nvidia_device(), reason="the CUDA notices are kept where a GPU is")
def test_library_use_is_quiet_too():
  """`load_config` / `create_model` import the families (so TensorFlow) without its notices."""
  recipe = os.path.join(REPO, "official", "resnet", "fashion_mnist_resnet.yaml")
  shown = subprocess.run([sys.executable, "-c", LIBRARY_USE, recipe], cwd=TESTS,
                         env=_environment(TPU_MODELS_TF_STARTUP_LOGS="1"), capture_output=True,
                         text=True, timeout=300)
  quiet = subprocess.run([sys.executable, "-c", LIBRARY_USE, recipe], cwd=TESTS,
                         env=_environment(), capture_output=True, text=True, timeout=300)
  assert shown.returncode == quiet.returncode == 0, (shown.stderr[-2000:], quiet.stderr[-2000:])
  assert quiet.stdout == shown.stdout == "built True\n"
  notices = startup.STARTUP_NOTICES + startup.NO_GPU_NOTICES
  shown_notices = [n for n in notices if n in shown.stderr]
  assert shown_notices, shown.stderr  # This machine's TensorFlow prints some of them.
  assert not [n for n in notices if n in quiet.stderr], quiet.stderr


def test_benchmark_writes_to_the_given_model_dir(tmp_path, capsys):
  model_dir = tmp_path / "bench"
  assert cli.main(["benchmark", os.path.join(TESTS, "toy.yaml"), "--import", "toy_task",
                   "--model-dir", str(model_dir), "--steps", "3", "--warmup", "2"]) == 0
  assert "examples/s" in capsys.readouterr().out
  rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if r["split"] == "train"] == [2, 5]
