"""benchmarks/convergence.py and `expect:` blocks: --list, and real --all runs of the toy task."""

import json
import os
import re

import pytest
import yaml

from conftest import REPO, benchmark_script, run_main
from tpu_models import config as config_lib

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def convergence(capfd, monkeypatch, environ):
  """The script's main() as a user would call it, from tests/ so that `--import toy_task`
  resolves, in this process: its training runs are child processes all the same, and a
  child per call would spend ~8 s of CPU importing TensorFlow only to read the YAMLs.
  """
  script = benchmark_script("convergence")
  monkeypatch.chdir(TESTS)
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")  # For the training runs it starts.

  def run(*args, imports=("--import", "toy_task")):
    return run_main(capfd, script.main, [*args, *imports])

  return run


def _table_rows(stdout):
  """{experiment: [cells]} of the markdown rows in `stdout`."""
  rows = {}
  for line in stdout.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if line.startswith("| toy/"):
      rows[cells[0]] = cells
  return rows


@pytest.fixture(scope="module")
def experiments(tmp_path_factory):
  """A directory like official/: toy experiments with and without expect blocks."""
  root = tmp_path_factory.mktemp("experiments")
  os.makedirs(root / "toy")
  with open(os.path.join(TESTS, "toy.yaml")) as f:
    toy = yaml.safe_load(f)

  def write(name, expect):
    data = dict(toy, expect=expect) if expect else dict(toy)
    (root / "toy" / f"{name}.yaml").write_text(yaml.safe_dump(data))

  # The toy MLP reaches ~0.9 eval accuracy in 40 steps (a few seconds).
  write("meets", {"metric": "accuracy", "at_least": 0.5, "split": "eval", "minutes": 5,
                  "hardware": "any 2-core CPU"})
  write("misses_metric", {"metric": "accuracy", "at_most": 0.05, "split": "eval", "minutes": 5})
  # 0.001 min: killed at 2x the bound (0.12 s), long before TensorFlow is even imported.
  write("misses_time", {"metric": "accuracy", "at_least": 0.5, "split": "eval", "minutes": 0.001})
  write("no_expect", None)
  # Extends an entry without declaring its own bounds: not an entry itself.
  (root / "toy" / "variant.yaml").write_text("base: meets.yaml\ntrainer: {train_steps: 20}\n")
  return root


def test_list_shows_declared_experiments_without_running(experiments, tmp_path, convergence):
  result = convergence("--list", "--experiments", str(experiments))
  assert result.returncode == 0, result.stderr
  rows = _table_rows(result.stdout)
  assert sorted(rows) == ["toy/meets", "toy/misses_metric", "toy/misses_time"]
  assert rows["toy/meets"][1:] == ["eval accuracy", ">= 0.5", "5 min", "any 2-core CPU"]
  assert rows["toy/misses_metric"][2] == "<= 0.05"
  assert not list(experiments.glob("**/metrics.jsonl"))

  only = convergence("--list", "--experiments", str(experiments), "--only", "misses")
  assert sorted(_table_rows(only.stdout)) == ["toy/misses_metric", "toy/misses_time"]


def test_all_passes_when_every_bound_is_met(experiments, tmp_path, convergence):
  result = convergence("--all", "--experiments", str(experiments), "--only", "meets",
                       "--model-dir", str(tmp_path), "--quiet",
                       "--set", "trainer.train_steps=30")
  assert result.returncode == 0, result.stdout + result.stderr
  rows = _table_rows(result.stdout)
  assert list(rows) == ["toy/meets"]
  experiment, metric, bound, reached, wall, time_bound, verdict = rows["toy/meets"]
  assert (metric, bound, time_bound, verdict) == ("eval accuracy", ">= 0.5", "5 min", "PASS")
  # The reached figure is the run's final eval accuracy in its metrics.jsonl (after 30 steps).
  model_dir = tmp_path / "toy-meets"
  eval_rows = [r for r in map(json.loads, (model_dir / "metrics.jsonl").read_text().splitlines())
               if r["split"] == "eval"]
  assert eval_rows[-1]["step"] == 30
  assert reached == f"{eval_rows[-1]['accuracy']:.4f}"
  assert 0 < float(wall.split()[0]) < 5
  assert "step 30/30" in (model_dir / "convergence.log").read_text()
  # A convergence check starts from scratch: the same model_dir again is refused.
  again = convergence("--all", "--experiments", str(experiments), "--only", "meets",
                      "--model-dir", str(tmp_path), "--quiet")
  assert again.returncode == 2 and "already holds a run" in again.stderr


def test_all_fails_on_a_missed_metric_or_time(experiments, tmp_path, convergence):
  result = convergence("--all", "--experiments", str(experiments), "--only", "toy/misses_*",
                       "--model-dir", str(tmp_path), "--quiet")
  assert result.returncode == 1, result.stdout + result.stderr
  rows = _table_rows(result.stdout)
  assert sorted(rows) == ["toy/misses_metric", "toy/misses_time"]
  verdict = rows["toy/misses_metric"][-1]
  reached = float(rows["toy/misses_metric"][3])
  assert verdict == f"FAIL: accuracy {reached:.4f} > 0.05" and reached > 0.5
  verdict = rows["toy/misses_time"][-1]
  assert verdict.startswith("FAIL: stopped after 0.0 min (2x the bound)")
  assert "> 0.001 min" in verdict


def test_expect_block_is_checked():
  import toy_task  # noqa: F401  (registers the task "toy")
  base = {"task": {"name": "toy"}}
  with pytest.raises(config_lib.ConfigError, match=r"expect\.minuts.*Did you mean 'minutes'"):
    config_lib.experiment_from_dict(
        dict(base, expect={"metric": "top1", "at_least": 0.9, "minuts": 20}))
  with pytest.raises(config_lib.ConfigError, match="exactly one of 'at_least' and 'at_most'"):
    config_lib.experiment_from_dict(
        dict(base, expect={"metric": "top1", "at_least": 0.9, "at_most": 0.95}))
  with pytest.raises(config_lib.ConfigError, match="expect.split.*eval, test"):
    config_lib.experiment_from_dict(
        dict(base, expect={"metric": "top1", "at_least": 0.9, "split": "validation"}))
  config = config_lib.experiment_from_dict(base)
  assert config.expect is None


def test_official_fashion_mnist_declares_its_bounds(convergence):
  config = config_lib.load_config(os.path.join(REPO, "official/resnet/fashion_mnist_resnet.yaml"))
  expect = config.expect
  assert (expect.metric, expect.at_least, expect.split, expect.minutes) == ("top1", 0.93, "test", 20)
  result = convergence("--list", imports=())
  assert result.returncode == 0, result.stderr
  assert "| resnet/fashion_mnist_resnet | test top1 | >= 0.93 | 20 min |" in result.stdout
  assert "fashion_mnist_resnet_jpeg" not in result.stdout  # Extends it; declares no bounds.


def test_a_time_bound_is_scaled_by_the_speed_measured_on_this_machine(tmp_path, convergence):
  """expect.examples_per_second: bound = minutes x reference / measured here, both printed."""
  root = tmp_path / "experiments"
  os.makedirs(root / "toy")
  with open(os.path.join(TESTS, "toy.yaml")) as f:
    toy = yaml.safe_load(f)
  bounds = {
      # A reference 10^12 ex/s fast: 0.001 min becomes ample here.
      "fast_reference": {"minutes": 0.001, "examples_per_second": 1.0e12},
      # A reference of 0.001 ex/s: 5 min shrink to microseconds, a miss on time.
      "slow_reference": {"minutes": 5, "examples_per_second": 1.0e-3}}
  for name, bound in bounds.items():
    expect = dict(bound, metric="accuracy", at_least=0.5, split="eval", hardware="imaginary")
    (root / "toy" / f"{name}.yaml").write_text(yaml.safe_dump(dict(toy, expect=expect)))
  result = convergence("--all", "--experiments", str(root), "--model-dir", str(tmp_path / "runs"),
                       "--quiet", "--calibration-steps", "5")
  assert result.returncode == 1, result.stdout + result.stderr
  rows = _table_rows(result.stdout)
  for name, bound in bounds.items():
    number = r"([\d,.e+-]+)"
    match = re.search(rf"Calibration of toy/{name}: {number} ex/s here, {number} ex/s on the "
                      rf"reference \(imaginary\): time bound {bound['minutes']:g} min x {number} "
                      rf"= {number} min", result.stdout)
    assert match, result.stdout
    measured, reference, scale, minutes = (float(g.replace(",", "")) for g in match.groups())
    assert measured > 0 and reference == pytest.approx(bound["examples_per_second"], rel=1e-3)
    assert scale == pytest.approx(reference / measured, rel=0.01)  # Printed to 3 digits.
    assert minutes == pytest.approx(bound["minutes"] * scale, rel=0.01)
    cell = rows[f"toy/{name}"][5]  # "<scaled> min (<minutes> x <scale>)"
    assert float(cell.split()[0]) == pytest.approx(minutes, rel=0.01, abs=0.05)
    assert f" min ({bound['minutes']:g} x " in cell
  assert rows["toy/fast_reference"][-1] == "PASS"
  assert rows["toy/slow_reference"][-1].startswith("FAIL: stopped after 0.0 min (2x the bound)")
  # Without calibration the same 0.001 min is read as it stands: a miss.
  plain = convergence("--all", "--experiments", str(root), "--only", "fast",
                      "--model-dir", str(tmp_path / "plain"), "--quiet", "--no-calibrate")
  assert plain.returncode == 1 and "Calibration of" not in plain.stdout
  assert _table_rows(plain.stdout)["toy/fast_reference"][-1].startswith("FAIL: stopped after")
