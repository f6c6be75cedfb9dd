"""Shared helpers of the fault-injection tests: subprocess commands, damage, inventories.

The toy runs' child and weights come from tests/helpers/toy_runs.py; this adds
the fault driver, file damage and the "no checkpoint file lost" inventory.
"""

import glob
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf
import yaml

from tpu_models.vision.classification import example as example_lib
from tpu_models.training import progress
from helpers.toy_runs import train_child

HERE = os.path.dirname(os.path.abspath(__file__))
# `python -c PEAK ARGV...`: `tpu-models ARGV...`, then its own peak memory on stderr
# ("VMHWM_MB N"), not the forking pytest worker's (ru_maxrss would be: Linux carries it over exec).
PEAK = r"""
import sys
from tpu_models import cli
code = cli.main(sys.argv[1:])
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(f"VMHWM_MB {int(hwm.split()[1]) / 1024:.0f}", file=sys.stderr)
sys.exit(code)
"""
DRIVER = os.path.join(HERE, "fault_driver.py")
UNREADABLE = "unreadable_checkpoints"


def train_command(model_dir, *overrides, fault=None):
  """(cmd, env) of `tpu-models train tests/toy.yaml ...`, optionally through the fault driver."""
  cmd, env = train_child(model_dir, *overrides)
  env["PYTHONPATH"] = os.pathsep.join([HERE, env["PYTHONPATH"]])
  if fault:
    name, step = fault
    cmd = [sys.executable, DRIVER, name, str(step), "--"] + cmd[3:]
  return cmd, env


def driver_command(argv, fault):
  """(cmd, env) of `tpu-models ARGV...` through the fault driver with `fault` = (name, step)."""
  _, env = train_child("unused")
  env["PYTHONPATH"] = os.pathsep.join([HERE, env["PYTHONPATH"]])
  name, step = fault
  return [sys.executable, DRIVER, name, str(step), "--"] + [str(a) for a in argv], env


def write_cases(tmp_path, cases):
  """(cases.json written, results.json to come) under `tmp_path`: the driver's batch input."""
  def as_json(case):
    if isinstance(case, dict) and "serve" in case:
      return {key: [str(v) for v in value] if isinstance(value, list) else str(value)
              for key, value in case.items()}
    if isinstance(case, dict):
      return {"argv": [str(a) for a in case["argv"]], "env": case.get("env", {})}
    return [str(a) for a in case]

  cases_file, out_file = tmp_path / "cases.json", tmp_path / "results.json"
  cases_file.write_text(json.dumps([as_json(case) for case in cases]))
  return cases_file, out_file


def run_batch(tmp_path, cases, timeout=600):
  """Runs each argv of `cases` through `cli.main` in ONE subprocess; returns their results.

  A case is an argv list, or {"argv": [...], "env": {...}} (variables set for that case), or
  {"serve": EXPORT_DIR, "images": [...], "copy_to": DIR} (see fault_driver.py).
  """
  cases_file, out_file = write_cases(tmp_path, cases)
  _, env = train_child(tmp_path)
  env["PYTHONPATH"] = os.pathsep.join([HERE, env["PYTHONPATH"]])
  done = subprocess.run([sys.executable, DRIVER, "batch", str(cases_file), str(out_file)],
                        env=env, cwd=HERE, capture_output=True, text=True, timeout=timeout)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(out_file.read_text())


def error_line(result):
  """The one error line of a failed CLI run (and that it is not a traceback)."""
  assert not result["traceback"], result["traceback"]
  lines = [line for line in result["stderr"].splitlines() if line.strip()]
  errors = [line for line in lines if line.startswith("tpu-models ")]
  assert len(errors) == 1, result["stderr"]
  return errors[0]


def truncate(path, nbytes):
  os.truncate(path, os.path.getsize(path) - nbytes)


def flip_byte(path, offset=None):
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2 if offset is None else offset] ^= 0xFF
  open(path, "wb").write(bytes(data))


def checkpoint_inventory(model_dir):
  """{file name: sha256} of every checkpoint file (ckpt-*) in model_dir."""
  return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
          for p in glob.glob(os.path.join(str(model_dir), "ckpt-*")) if os.path.isfile(p)}


def assert_nothing_lost(before, model_dir):
  """Every checkpoint file of `before` is still in model_dir unchanged, or moved aside intact."""
  now = checkpoint_inventory(model_dir)
  aside = {hashlib.sha256(open(p, "rb").read()).hexdigest()
           for p in glob.glob(os.path.join(str(model_dir), UNREADABLE, "ckpt-*"))}
  for name, digest in before.items():
    assert now.get(name) == digest or digest in aside, f"{name} was lost or changed"


def train_steps_logged(model_dir):
  return [r["step"] for r in progress.read_metrics(str(model_dir), "train")]


# Tiny classification experiments (tiny_image_model.py) on 16x16 JPEG TFRecords.


def _jpeg(rng):
  return tf.io.encode_jpeg(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).numpy()


def _write(path, n, rng, broken=()):
  """n records with labels i % 4; records in `broken` hold a truncated (undecodable) JPEG."""
  with tf.io.TFRecordWriter(str(path)) as writer:
    for i in range(n):
      data = _jpeg(rng)
      if i in broken:
        data = data[:len(data) // 3]
      writer.write(example_lib.image_example(data, i % 4).SerializeToString())
  return str(path)


def _record_offsets(path):
  """Byte offset of each record in a TFRecord file (8-byte length, 4 CRC, data, 4 CRC)."""
  data, offsets, at = open(path, "rb").read(), [], 0
  while at < len(data):
    offsets.append(at)
    at += 16 + int.from_bytes(data[at:at + 8], "little")
  return offsets


def tiny_experiment(tmp_path):
  """(tmp_path/tiny.yaml, tmp_path/run, the CLI flags naming both): the tiny classifier's
  experiment (_experiment) on 16 records (tmp_path/data-0, train and eval alike), the model
  directory for it, and `--import tiny_image_model --model-dir` that directory."""
  data = _write(tmp_path / "data-0", 16, np.random.default_rng(0))
  model_dir = tmp_path / "run"
  return (_experiment(tmp_path, "tiny", data, data), model_dir,
          ["--import", "tiny_image_model", "--model-dir", model_dir])


def _experiment(tmp_path, name, train, eval_path, **task):
  config = {
      "task": {"name": "classification",
               "model": {"name": "reliability_tiny_cnn", "num_classes": 4},
               "image_size": 16, "augment": "none", "flip": False,
               "train_data": {"path": train, "global_batch_size": 4, "shuffle_buffer": 0},
               "eval_data": {"path": eval_path, "global_batch_size": 4}, **task},
      "trainer": {"train_steps": 4, "steps_per_loop": 2, "checkpoint_every": 2,
                  "optimizer": {"name": "sgd"}, "schedule": {"name": "constant", "base_lr": 0.01},
                  "tensorboard": False},
      "runtime": {"strategy": "cpu"}}
  path = tmp_path / f"{name}.yaml"
  path.write_text(yaml.safe_dump(config))
  return path
