"""Fault injection on what a run depends on and records: the precision `auto` picks on CPUs
with and without native bfloat16 (flags faked through the fault driver); two training
processes on one model_dir (the model_dir lock); a metrics.jsonl whose last line a kill or a
full disk cut short; resuming with another batch size, momentum or learning rate; config
files and values that must be one-line errors at load time (base: cycles and lists, a damaged
config.yaml in a model_dir, NaN/inf, int64 overflow, sizes <= 0)."""

import io
import json
import os
import signal
import socket
import subprocess

import pytest
import tensorflow as tf
import yaml

import toy_task  # noqa: F401  (registers the toy task)
from conftest import REPO
from helpers.processes import wait_for
from faults import checkpoint_inventory, error_line, train_command, train_steps_logged
from in_process import run_batch_here, train_here
from tpu_models.training import checkpoints, progress
from tpu_models.training.trainer import Trainer

TOY = os.path.join(REPO, "tests", "toy.yaml")
AVX2_ONLY = "fpu sse4_2 avx avx2 fma f16c bmi2"
AMX = AVX2_ONLY + " avx512f avx512bw avx512_bf16 amx_tile amx_bf16"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("run_record_faults")
  # The runs the faults are injected into (trained here: they are not the faults).
  cut = tmp / "cut"
  changed, damaged = tmp / "changed", tmp / "damaged"
  for model_dir, overrides in ((cut, ["trainer.steps_per_loop=5"]), (changed, []),
                               (damaged, [])):
    trainer = Trainer(toy_task.toy_config(["trainer.train_steps=20"] + overrides),
                      str(model_dir), stream=io.StringIO())
    trainer.train()
    trainer.close()
  first_record = (changed / "config.yaml").read_text()
  (damaged / "config.yaml").write_text("task: {name: toy\ntrainer: [")  # Cut short by a kill.
  # Config files: a base cycle, a base given a list, a size <= 0 of a model and of a task.
  (tmp / "a.yaml").write_text("base: b.yaml\n")
  (tmp / "b.yaml").write_text(f"base: a.yaml\ntrainer: {{train_steps: 5}}\n")
  (tmp / "listed.yaml").write_text(f"base: [{TOY}, b.yaml]\n")
  image_task = ("task:\n  name: classification\n  model: {name: resnet18, num_classes: 4%s}\n"
                "  train_data: {path: /none/train-*}\n%s")
  (tmp / "width.yaml").write_text(image_task % (", width: -4", ""))
  (tmp / "image_size.yaml").write_text(image_task % ("", "  image_size: 0\n"))
  # What a kill (or a full disk) in the middle of a row leaves: the last line cut short.
  metrics = (cut / "metrics.jsonl").read_text()
  last = metrics.splitlines()[-1]
  left = metrics[:len(metrics) - 1 - len(last) // 2]  # The newline and half the last row gone.
  (cut / "metrics.jsonl").write_text(left)
  fragment = left.splitlines()[-1]

  def toy_train(model_dir, *overrides, env=None):
    argv = ["train", TOY, "--import", "toy_task", "--model-dir", model_dir, "--mode", "train"]
    for o in overrides:
      argv += ["--set", o]
    return {"argv": argv, "env": env or {}}

  auto = "runtime.mixed_precision=auto"
  cases = {
      # Precision: auto on an AVX2-only CPU and on an AMX one (flags faked, not this CPU's).
      "auto_avx2": toy_train(tmp / "auto_avx2", auto, "trainer.train_steps=10",
                             env={"FAULT_CPU_FLAGS": AVX2_ONLY}),
      "auto_amx": toy_train(tmp / "auto_amx", auto, "trainer.train_steps=10",
                            env={"FAULT_CPU_FLAGS": AMX}),
      "auto_amx_limited": toy_train(tmp / "auto_amx_limited", auto, "trainer.train_steps=10",
                                    env={"FAULT_CPU_FLAGS": AMX, "ONEDNN_MAX_CPU_ISA": "AVX2"}),
      # metrics.jsonl with its last line cut short: resumed.
      "cut_resume": toy_train(cut, "trainer.train_steps=30", "trainer.steps_per_loop=5"),
      # Resumed with another batch size and momentum; then another learning rate; then with
      # only the length and the eval/logging keys changed.
      "changed_batch": toy_train(changed, "trainer.train_steps=30",
                                 "task.train_data.global_batch_size=32",
                                 "trainer.optimizer.momentum=0.5"),
      "changed_lr": toy_train(changed, "trainer.train_steps=40",
                              "task.train_data.global_batch_size=32",
                              "trainer.optimizer.momentum=0.5", "trainer.schedule.base_lr=0.05"),
      "changed_length": toy_train(changed, "trainer.train_steps=50",
                                  "task.train_data.global_batch_size=32",
                                  "trainer.optimizer.momentum=0.5", "trainer.schedule.base_lr=0.05",
                                  "trainer.eval_steps=2", "trainer.steps_per_loop=5",
                                  "trainer.checkpoint_every=5"),
      # One-line errors at load time.
      "damaged_train": toy_train(damaged, "trainer.train_steps=20"),
      "damaged_evaluate": ["evaluate", TOY, "--import", "toy_task", "--model-dir", damaged],
      "base_cycle": ["train", tmp / "a.yaml", "--model-dir", tmp / "base_cycle"],
      "base_list": ["train", tmp / "listed.yaml", "--model-dir", tmp / "base_list"],
      "nan_lr": toy_train(tmp / "nan_lr", "trainer.schedule.base_lr=.nan"),
      "inf_lr": toy_train(tmp / "inf_lr", "trainer.schedule.base_lr=inf"),
      "inf_momentum": toy_train(tmp / "inf_momentum", "trainer.optimizer.momentum=-.inf"),
      "overflow_steps": toy_train(tmp / "overflow_steps",
                                  "trainer.train_steps=9223372036854775808"),
      "float_overflow_steps": toy_train(tmp / "float_overflow_steps",
                                        "trainer.train_steps=1.0e+30"),
      "width": ["train", tmp / "width.yaml", "--model-dir", tmp / "width"],
      "image_size": ["train", tmp / "image_size.yaml", "--model-dir", tmp / "image_size"],
      # A model_dir whose name TensorFlow would read as a glob pattern.
      "glob_train": toy_train(tmp / "exp[1]", "trainer.train_steps=5"),
      "glob_evaluate": ["evaluate", TOY, "--import", "toy_task", "--model-dir", tmp / "exp*"],
  }
  names = list(cases)
  outcome = dict(zip(names, run_batch_here(tmp, [cases[n] for n in names])))
  outcome.update(tmp=tmp, fragment=fragment, first_record=first_record)
  return outcome


def _ok(result):
  assert result["code"] == 0, result["stderr"] + result["traceback"]
  return result["stdout"]


@pytest.mark.parametrize("case,chosen,reason", [
    ("auto_avx2", "float32", "this CPU has neither AVX512_BF16 nor AMX (bfloat16 would be "
                             "emulated)"),
    ("auto_amx", "bfloat16", "this CPU computes bfloat16 natively (amx_bf16, avx512_bf16)"),
    ("auto_amx_limited", "float32", "ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN from this CPU's "
                                    "amx_bf16/avx512_bf16"),
])
def test_auto_precision_follows_the_cpu_and_says_why(runs, case, chosen, reason):
  out = _ok(runs[case])
  lines = [line for line in out.splitlines() if "mixed_precision auto" in line]
  assert lines == [f"runtime.mixed_precision auto: {chosen} ({reason})."]
  assert f"| {chosen} |" in out  # The describe line: what the model was built in.
  assert "mixed_precision: auto" in (runs["tmp"] / case / "config.yaml").read_text()


def _lock_holder(model_dir):
  path = model_dir / "train.lock"
  return json.loads(path.read_text()) if path.exists() else None


def test_a_second_training_process_is_refused_and_a_dead_holders_lock_taken_over(tmp_path,
                                                                                  capfd):
  run = tmp_path / "run"
  long_run = ("trainer.train_steps=10000000", "trainer.steps_per_loop=10",
              "trainer.checkpoint_every=100000")
  cmd, env = train_command(run, *long_run)
  first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  metrics = run / "metrics.jsonl"
  assert wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, 300, first)
  holder = _lock_holder(run)
  assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
  config_yaml = (run / "config.yaml").read_text()

  # A second `train` (another step count, as a user retrying would) while the first runs: in
  # this process, another than the holder's.
  second = run_batch_here(tmp_path, [["train", TOY, "--import", "toy_task", "--model-dir", run,
                                      "--mode", "train", "--set", "trainer.train_steps=50"]])[0]
  assert second["code"] == 2
  line = error_line(second)
  assert (f"{run} is being trained by another process (pid {first.pid} on host "
          f"{socket.gethostname()}, started {holder['started']}; lock file {run}/train.lock)"
          in line), line
  assert first.poll() is None  # The first run goes on, its record untouched.
  assert (run / "config.yaml").read_text() == config_yaml
  assert not (run / checkpoints.UNREADABLE_DIR).exists()

  # SIGTERM: the first run saves, exits 143 and gives the lock up.
  first.send_signal(signal.SIGTERM)
  _, err = first.communicate(timeout=120)
  assert first.returncode == 143, err
  assert _lock_holder(run) is None

  # SIGKILL leaves the lock of a dead process: the next run takes it over and resumes.
  cmd, env = train_command(run, *long_run)
  killed = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  rows = len(train_steps_logged(run))
  assert wait_for(lambda: len(train_steps_logged(run)) > rows, 300, killed)
  assert _lock_holder(run)["pid"] == killed.pid
  killed.kill()
  killed.wait(timeout=60)
  step = checkpoints.saved_step(tf.train.latest_checkpoint(str(run)))
  before = checkpoint_inventory(run)
  done = train_here(capfd, run, f"trainer.train_steps={step + 10}")  # This process takes over.
  assert done.returncode == 0, done.stderr
  assert (f"Took over the lock of {run} ({run}/train.lock): its holder, pid {killed.pid} on "
          f"host {socket.gethostname()}" in done.stdout), done.stdout
  assert "no longer runs." in done.stdout
  assert f"Resumed from {run}/ckpt-{step} at step {step}." in done.stdout
  assert set(before) <= set(checkpoint_inventory(run))  # Nothing moved aside.
  assert _lock_holder(run) is None  # Released at the normal end.


def test_a_cut_last_line_of_metrics_jsonl_is_repaired_on_resume(runs):
  out = _ok(runs["cut_resume"])
  cut = runs["tmp"] / "cut"
  assert ("metrics.jsonl: 1 line(s) cut short (by a kill or a full disk) moved to "
          "metrics.rewound.jsonl." in out)
  text = (cut / "metrics.jsonl").read_text()
  rows = [json.loads(line) for line in text.splitlines()]  # Every line is a row again.
  assert [r["step"] for r in rows if r["split"] == "train"] == [5, 10, 15, 25, 30]
  # The resume marker is a row of its own, not glued to the fragment.
  (resume,) = [r for r in rows if r["split"] == "resume"]
  assert resume["step"] == 20 and resume["checkpoint"] == "ckpt-20"
  rewound = [json.loads(line) for line in (cut / "metrics.rewound.jsonl").read_text().splitlines()]
  assert rewound == [{"split": "fragment", "line": runs["fragment"]}]
  assert progress.read_metrics(str(cut), "resume") == [resume]


def test_resuming_with_a_changed_config_keeps_every_earlier_record(runs):
  changed = runs["tmp"] / "changed"
  out = _ok(runs["changed_batch"])
  assert (f"The config differs from the one that trained steps 1-20 of this run in 2 key(s): "
          f"task.train_data.global_batch_size: 16 -> 32; trainer.optimizer.momentum: 0.9 -> 0.5. "
          f"That record is kept as {changed}/config.1.yaml; {changed}/config.yaml now records "
          f"this config." in out), out
  assert "Resumed from" in out and "step 30/30" in out
  out = _ok(runs["changed_lr"])
  assert ("in 1 key(s): trainer.schedule.base_lr: 0.1 -> 0.05. That record is kept as "
          f"{changed}/config.2.yaml" in out), out
  out = _ok(runs["changed_length"])  # Length, eval and logging keys: no new record.
  assert "The config differs" not in out
  assert not (changed / "config.3.yaml").exists()
  # Every record, unchanged: the first byte for byte, then each resumed run's own.
  assert (changed / "config.1.yaml").read_text() == runs["first_record"]
  second = yaml.safe_load((changed / "config.2.yaml").read_text())
  assert second["task"]["train_data"]["global_batch_size"] == 32
  assert second["trainer"]["schedule"]["base_lr"] == 0.1
  now = yaml.safe_load((changed / "config.yaml").read_text())
  assert now["trainer"]["schedule"]["base_lr"] == 0.05 and now["trainer"]["train_steps"] == 50


@pytest.mark.parametrize("case,expected", [
    ("damaged_train", "damaged/config.yaml is not valid YAML (while parsing a flow mapping"),
    ("damaged_evaluate", "damaged/config.yaml is not valid YAML"),
    ("base_cycle", "Config key 'base' in {tmp}/b.yaml makes a cycle: {tmp}/a.yaml -> "
                   "{tmp}/b.yaml -> {tmp}/a.yaml."),
    ("base_list", "Config key 'base' in {tmp}/listed.yaml must be one file name (a string), got "
                  "list"),
    ("nan_lr", "Config key 'trainer.schedule.base_lr' must be a finite number; got nan."),
    ("inf_lr", "Config key 'trainer.schedule.base_lr' must be a finite number; got inf."),
    ("inf_momentum", "Config key 'trainer.optimizer.momentum' must be a finite number; got -inf."),
    ("overflow_steps", "Config key 'trainer.train_steps' must fit in a 64-bit integer "
                       "(-9223372036854775808 to 9223372036854775807); got 9223372036854775808."),
    ("float_overflow_steps", "Config key 'trainer.train_steps' must fit in a 64-bit integer"),
    ("width", "Config key 'task.model.width' is a size and must be > 0; got -4."),
    ("image_size", "Config key 'task.image_size' is a size and must be > 0; got 0."),
    ("glob_train", "model_dir '{tmp}/exp[1]' contains [ ]: TensorFlow reads those as a file "
                   "pattern when it looks for checkpoints"),
    ("glob_evaluate", "model_dir '{tmp}/exp*' contains *: TensorFlow reads those as a file "
                      "pattern"),
])
def test_bad_config_files_and_values_are_one_line_errors(runs, case, expected):
  result = runs[case]
  assert result["code"] == 2, result["stdout"] + result["stderr"] + result["traceback"]
  assert expected.format(tmp=runs["tmp"]) in error_line(result)
  model_dir = runs["tmp"] / case
  assert not model_dir.exists() or not list(model_dir.glob("ckpt-*"))


def test_a_model_dir_named_like_a_glob_is_refused_before_anything_is_written(runs):
  assert not (runs["tmp"] / "exp[1]").exists()


def test_a_damaged_config_record_is_left_as_it_was(runs):
  damaged = runs["tmp"] / "damaged"
  assert "repair it, or move it away (e.g. to config.yaml.damaged)" in error_line(
      runs["damaged_train"])
  assert (damaged / "config.yaml").read_text() == "task: {name: toy\ntrainer: ["
  assert not (damaged / "train.lock").exists()  # Released on the error.
  assert tf.train.latest_checkpoint(str(damaged)).endswith("ckpt-20")
