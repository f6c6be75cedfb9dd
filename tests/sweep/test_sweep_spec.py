"""Sweep files checked before anything starts, and the results read from a sweep directory.

Every mistake in a sweep file is one line naming the key, the value and what is
expected (exit 2 through the CLI), before Ray starts; `tpu-models sweep` without
Ray installed names the extra to install (exit 2).
"""

import json
import os
import sys

import pytest
import yaml

from tpu_models import cli
from tpu_models.errors import ConfigError
from tpu_models.sweep import files, results, spec
from tpu_models.sweep import trial as trial_lib

from sweep_helpers import REPO, TESTS, TOY_SWEEP, run_sweep_here

OFFICIAL = os.path.join(REPO, "official", "resnet", "fashion_mnist_sweep.yaml")


def _sweep_file(tmp_path, sweep_section, experiment=None):
  data = dict(experiment or {}, base=os.path.join(TESTS, "toy.yaml"))
  data["sweep"] = dict({"imports": ["toy_task"]}, **sweep_section)
  path = tmp_path / "s.yaml"
  path.write_text(yaml.safe_dump(data))
  return str(path)


def test_the_toy_sweep_loads_with_its_metric_direction_and_grid(tmp_path):
  sweep = spec.load_sweep(TOY_SWEEP, [f"sweep.directory={tmp_path}/d"])
  assert (sweep.metric, sweep.mode) == ("accuracy", "max")  # The task's HIGHER.
  assert [d.key for d in sweep.dimensions] == ["trainer.schedule.base_lr", "task.model.hidden"]
  assert sweep.grid_size == 2 and sweep.train_steps == 40 and sweep.eval_every == 10
  assert sweep.directory == str(tmp_path / "d")
  config = sweep.trial_config({"trainer.schedule.base_lr": 1e-4, "task.model.hidden": 16})
  assert config.trainer.schedule.base_lr == 1e-4 and config.task.model.params["hidden"] == 16


def test_a_lower_is_better_metric_ranks_by_min(tmp_path):
  sweep = spec.load_sweep(TOY_SWEEP, ["sweep.metric=loss"])
  assert sweep.mode == "min"


def test_the_official_sweep_is_valid_and_ranks_by_validation_top1():
  sweep = spec.load_sweep(OFFICIAL)
  assert (sweep.metric, sweep.mode, sweep.config.trials) == ("top1", "max", 12)
  assert sweep.config.scheduler.name == "asha" and sweep.eval_every == 300
  assert sweep.directory.endswith(os.path.join("runs", "sweeps", "fashion_mnist_sweep"))


@pytest.mark.parametrize("section, experiment, expected", [
    ({"space": {}}, None, r"sweep.space is empty"),
    ({"space": {"trainer.schedule.base_rate": {"choice": [0.1]}}}, None,
     r"'trainer.schedule.base_rate'.*Unknown config key 'trainer.schedule.base_rate'.*"
     r"Did you mean 'base_lr'"),
    ({"space": {"trainer.train_steps": {"choice": [40, 0]}}}, None,
     r"'trainer.train_steps' = 0 is refused.*must be >= 1"),
    ({"space": {"trainer.schedule.base_lr": {"loguniform": [0, 0.1]}}}, None,
     r"loguniform needs 0 < low < high"),
    ({"space": {"trainer.schedule.base_lr": {"uniform": [0.3, 0.1]}}}, None,
     r"uniform needs low < high; got \[0.3, 0.1\]"),
    ({"space": {"trainer.schedule.base_lr": {"lognormal": [0.1, 1]}}}, None,
     r"unknown distribution 'lognormal'.*Did you mean 'loguniform'"),
    ({"space": {"trainer.schedule.base_lr": 0.1}}, None,
     r"must be one distribution .* got 0.1"),
    ({"space": {"task.model.hidden": {"randint": [4, 8.5]}}}, None, r"randint needs two integers"),
    ({"space": {"task.model.hidden": {"grid": [4, 8]}}, "trials": 3, "metric": "accuracy"}, None,
     r"sweep.trials is 3, not a multiple of the 2 grid points.*use 2 or 4"),
    ({"space": {"task.model.hidden": {"choice": [4]}}, "trails": 3}, None,
     r"Unknown config key 'sweep.trails'.*Did you mean 'trials'"),
    ({"space": {"task.model.hidden": {"choice": [4]}}, "metric": "acuracy"}, None,
     r"does not say whether a higher or lower 'acuracy' is better.*ranks: loss, accuracy"),
    ({"space": {"task.model.hidden": {"choice": [4]}}, "metric": "examples"}, None,
     r"'examples' is better"),
    ({"space": {"task.model.hidden": {"choice": [4]}}}, None,
     r"sweep.metric is not set and the experiment has no trainer.target_metric"),
    ({"space": {"task.model.hidden": {"choice": [4]}}, "metric": "accuracy"},
     {"trainer": {"eval_every": 15, "checkpoint_every": 10}},
     r"trainer.checkpoint_every \(10\) does not divide trainer.eval_every \(15\)"),
    ({"space": {"task.model.hidden": {"choice": [4]}}, "metric": "accuracy",
      "scheduler": {"name": "asha"}}, None,
     r"asha stops trials at their evaluations, but trainer.eval_every is 0"),
    ({"space": {"task.model.hidden": {"choice": [4]}}, "metric": "accuracy",
      "scheduler": {"name": "hyperband"}}, None, r"sweep.scheduler.name is 'hyperband'; expected"),
    ({"space": {"task.model.hidden": {"grid": [4, 8]}}, "metric": "accuracy", "trials": 2,
      "search": "optuna"}, None, r"optuna samples every key; a 'grid' key needs search: random"),
    ({"space": {"task.model.hidden": {"choice": [4]}}, "metric": "accuracy",
      "resources": {"cpu": 0}}, None, r"sweep.resources.cpu is 0.0; expected more than 0"),
])
def test_a_bad_sweep_file_is_one_error_naming_the_key(tmp_path, section, experiment, expected):
  with pytest.raises(ConfigError, match=expected):
    spec.load_sweep(_sweep_file(tmp_path, section, experiment))


def test_the_cli_says_it_in_one_line_with_exit_2_before_starting_ray(tmp_path, capsys):
  path = _sweep_file(tmp_path, {"space": {"trainer.train_steps": {"choice": [0]}},
                                "metric": "accuracy"})
  assert cli.main(["sweep", path]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("tpu-models sweep: error:")
  assert "'trainer.train_steps' = 0" in err[0]
  assert not os.path.exists(tmp_path / "runs")  # Nothing written.


def test_a_file_without_a_sweep_section_is_refused(tmp_path):
  with pytest.raises(ConfigError, match="has no 'sweep:' section"):
    spec.load_sweep(os.path.join(TESTS, "toy.yaml"))


def test_space_keys_can_be_set_from_the_command_line(tmp_path):
  sweep = spec.load_sweep(TOY_SWEEP, ["sweep.space.task.model.hidden={choice: [3, 5, 7]}",
                                      "sweep.trials=3", "trainer.train_steps=20"])
  hidden = [d for d in sweep.dimensions if d.key == "task.model.hidden"][0]
  assert (hidden.kind, hidden.values) == ("choice", (3, 5, 7))
  assert sweep.config.trials == 3 and sweep.train_steps == 20


def test_without_ray_the_sweep_names_the_extra_and_exits_2(tmp_path, capfd, monkeypatch):
  # Ray hidden from the import system, as on an install without the `sweep` extra: in this
  # process (a child would spend ~8 s of CPU importing TensorFlow), with every loaded ray
  # module and the driver that imported it taken out until the test ends.
  import tpu_models.sweep
  for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")] + ["ray", "ray.tune"]:
    monkeypatch.setitem(sys.modules, name, None)
  monkeypatch.delitem(sys.modules, "tpu_models.sweep.driver", raising=False)
  monkeypatch.delattr(tpu_models.sweep, "driver", raising=False)
  done = run_sweep_here(capfd, monkeypatch, TOY_SWEEP, "--set", f"sweep.directory={tmp_path}")
  assert done.returncode == 2, done.stderr
  assert "pip install 'tpu-models[sweep]'" in done.stderr
  assert "Traceback" not in done.stderr
  assert "tpu_models.sweep.driver" not in sys.modules  # Ray was never reached.


def _fake_trial(directory, trial_id, params, curve, state, training_seconds=60.0):
  model_dir = trial_lib.trial_dir(str(directory), trial_id)
  os.makedirs(model_dir)
  with open(os.path.join(model_dir, "metrics.jsonl"), "w") as f:
    for step, value in curve:
      f.write(json.dumps({"split": "eval", "step": step, "top1": value}) + "\n")
  trial_lib.write_trial_record(model_dir, {
      "state": state, "params": params, "attempts": 1, "training_seconds": training_seconds,
      "step": curve[-1][0] if curve else 0, "started": 100.0, "ended": 200.0,
      "attempt_seconds": [100.0]})
  return model_dir


def test_the_leaderboard_ranks_by_validation_and_the_best_must_have_ended(tmp_path):
  files.write_json(os.path.join(tmp_path, files.RUNS_FILE), {"runs": []})
  (tmp_path / files.SWEEP_FILE).write_text(yaml.safe_dump(
      {"metric": "top1", "mode": "max", "train_steps": 30}))
  _fake_trial(tmp_path, "a_00000", {"lr": 0.1, "w": 16}, [(10, 0.5), (20, 0.6), (30, 0.7)], "done")
  _fake_trial(tmp_path, "a_00001", {"lr": 0.2, "w": 16}, [(10, 0.4)], "stopped")
  _fake_trial(tmp_path, "a_00002", {"lr": 0.3, "w": 16}, [(10, 0.9)], "running")
  _fake_trial(tmp_path, "a_00003", {"lr": 0.4, "w": 16}, [], "failed")
  files.write_trial_states(str(tmp_path), {"a_00003": {"status": "ERROR", "error": "boom"}})
  rows, record = results.collect(str(tmp_path))
  assert [r.trial for r in rows] == ["a_00002", "a_00000", "a_00001", "a_00003"]
  # No live driver holds the lock: the running one was interrupted.
  assert [r.state for r in rows] == ["interrupted", "done", "stopped", "failed"]
  best = results.best_trial(rows)  # 0.9 is higher, but that trial has not ended.
  assert best.trial == "a_00000" and best.value == 0.7
  text = results.leaderboard_text(rows, record)
  assert text.splitlines()[0].split() == ["#", "trial", "state", "top1", "step", "lr",
                                          "train", "min", "tries"]  # w never varied.
  assert "a_00003 failed: boom" in text
  assert "4 trials: 1 done, 1 stopped, 1 interrupted, 1 failed" in text
  csv_path = results.write_csv(rows, record, str(tmp_path / "l.csv"))
  lines = open(csv_path).read().splitlines()
  assert lines[0].startswith("rank,trial,state,top1,step,lr,w,")
  assert lines[1].startswith("1,a_00002,interrupted,0.9,10,0.3,16,")
  png = results.plot_curves(rows, record, str(tmp_path / "c.png"))
  assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_free_slot_seconds_counts_only_slots_a_waiting_trial_could_use():
  # Two slots; trial A runs 0-10, trial B starts at 4 and runs to 12: slots free 2x0..0,
  # then one slot free from 0 to 4 (B waiting), none after B starts.
  busy = [(0.0, 10.0), (4.0, 12.0)]
  assert results._free_slot_seconds(busy, 2, 0.0, 4.0) == pytest.approx(4.0)
  assert results._free_slot_seconds(busy, 1, 0.0, 4.0) == pytest.approx(0.0)
  assert results._free_slot_seconds([], 2, 0.0, 3.0) == pytest.approx(6.0)


def test_training_a_sweep_file_says_to_run_it_as_a_sweep():
  with pytest.raises(ConfigError, match="is a sweep file .*`tpu-models sweep "):
    from tpu_models import config as config_lib
    config_lib.load_config(OFFICIAL)
