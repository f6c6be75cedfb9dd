"""Whole sweeps through `tpu-models sweep`: ASHA early stopping, Optuna on a two-node Ray
cluster, and the best trial of a real Fashion-MNIST sweep exported and scored once on test."""

import json
import os
import sys

import pytest

from sweep_helpers import (REPO, TOY_SWEEP, checkpoints, ray_sandbox, run_sweep, run_sweep_here,
                           trial_records)
from tpu_models.sweep import files


def test_asha_stops_the_weak_trials_at_an_evaluation_with_their_checkpoint(tmp_path, capfd,
                                                                           monkeypatch):
  directory = str(tmp_path / "sweep")
  # One at a time, the strong learning rate first: the two that cannot learn (1e-6) are
  # below the rung's cut at their first evaluation (step 10).
  args = [TOY_SWEEP, "--set", f"sweep.directory={directory}", "--set", "sweep.trials=3",
          "--set", "sweep.concurrency=1", "--set", "sweep.scheduler.name=asha",
          "--set", "sweep.space.task.model.hidden={choice: [16]}",
          "--set", "sweep.space.trainer.schedule.base_lr={grid: [0.5, 1.0e-6, 2.0e-6]}"]
  with ray_sandbox() as ray_tmp:
    done = run_sweep(ray_tmp, *args)
  assert done.returncode == 0, done.stdout + done.stderr
  records = trial_records(directory)
  by_lr = {r["params"]["trainer.schedule.base_lr"]: r for r in records.values()}
  assert by_lr[0.5]["state"] == "done" and by_lr[0.5]["step"] == 40
  for lr in (1e-6, 2e-6):
    record = by_lr[lr]
    assert record["state"] == "stopped" and record["step"] == 10
    assert checkpoints(record["model_dir"]) == [10]  # Stopped after its checkpoint.
  assert "3 trials: 1 done, 2 stopped" in done.stdout
  assert "Trial-steps trained: 60 of the 120" in done.stdout and "(50% saved" in done.stdout
  # The leaderboard's files: every trial a CSV row, stopped ones marked.
  csv_lines = open(os.path.join(directory, files.LEADERBOARD_CSV)).read().splitlines()
  assert len(csv_lines) == 4 and csv_lines[1].split(",")[2] == "done"
  assert sorted(line.split(",")[2] for line in csv_lines[2:]) == ["stopped", "stopped"]
  assert open(os.path.join(directory, files.CURVES_PNG), "rb").read(4) == b"\x89PNG"
  # --report reads the same from the directory alone, without Ray.
  report = run_sweep_here(capfd, monkeypatch, *args, "--report")
  assert report.returncode == 0 and "3 trials: 1 done, 2 stopped" in report.stdout
  assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_optuna_trials_run_on_both_nodes_of_a_two_node_ray_cluster(tmp_path, monkeypatch,
                                                                    environ):
  from ray.cluster_utils import Cluster
  directory = str(tmp_path / "sweep")
  with ray_sandbox() as ray_tmp:
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False})
    try:
      cluster.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024)
      cluster.wait_for_nodes()
      # Optuna's sampler through Tune, the search a fleet sweep would use.
      done = run_sweep(ray_tmp, TOY_SWEEP, "--set", f"sweep.directory={directory}",
                       "--set", "sweep.trials=2", "--set", "sweep.search=optuna",
                       "--set", "sweep.space.task.model.hidden={choice: [4, 8, 16]}",
                       "--address", cluster.address)
    finally:
      cluster.shutdown()
  assert done.returncode == 0, done.stdout + done.stderr
  assert "2 node(s), 2 CPUs" in done.stdout
  records = trial_records(directory)
  assert sorted(r["state"] for r in records.values()) == ["done", "done"]
  # One CPU per node and one per trial: running together, they had one node each.
  assert len({r["nodes"][0] for r in records.values()}) == 2
  assert "search optuna" in done.stdout
  for record in records.values():
    assert 0.003 <= record["params"]["trainer.schedule.base_lr"] <= 0.3
    assert record["params"]["task.model.hidden"] in (4, 8, 16)


def test_a_fashion_mnist_sweep_exports_its_best_trial_scored_once_on_test(tmp_path):
  directory = str(tmp_path / "sweep")
  official = os.path.join(REPO, "official", "resnet", "fashion_mnist_sweep.yaml")
  tiny = ["sweep.trials=2", "sweep.scheduler.name=none", "trainer.train_steps=20",
          "trainer.eval_every=10", "trainer.checkpoint_every=10", "trainer.steps_per_loop=10",
          "trainer.schedule.warmup_steps=0", "task.model.width=4",
          "task.train_data.global_batch_size=32", "task.train_data.shuffle_buffer=256",
          "task.train_data.num_examples=640", "task.eval_data.num_examples=500",
          "task.test_data.num_examples=500",
          "sweep.space.task.model.width={choice: [4]}",
          "sweep.space.task.augment={choice: [none]}"]
  args = [official, "--set", f"sweep.directory={directory}"]
  for item in tiny:
    args += ["--set", item]
  with ray_sandbox() as ray_tmp:
    done = run_sweep(ray_tmp, *args, "--export-best", timeout=600)
  assert done.returncode == 0, done.stdout + done.stderr
  records = trial_records(directory)
  best_value, best_trial = max((r["result"]["top1"], t) for t, r in records.items())
  exported = json.load(open(os.path.join(directory, "best", "saved_model", "assets.extra",
                                         "export.json")))
  sweep = exported["sweep"]
  assert sweep["trial"] == best_trial and sweep["validation"] == pytest.approx(best_value)
  assert sweep["metric"] == "top1" and sweep["params"] == records[best_trial]["params"]
  assert sweep["test"]["metrics"]["examples"] == 500  # The test split, all of it, once.
  assert 0.0 <= sweep["test"]["metrics"]["top1"] <= 1.0
  assert exported["model_dir"] == records[best_trial]["model_dir"]
  assert "Test split, once, through" in done.stdout
