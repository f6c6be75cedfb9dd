"""benchmarks/recipe_variants.py: variant parsing, and a real two-variant run of the toy recipe."""

import argparse
import os

import pytest

from conftest import benchmark_script, run_main

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_variant_is_a_name_and_its_overrides():
  parse = benchmark_script("recipe_variants").parse_variant
  assert parse("wide head: task.model.width=64 , trainer.train_steps=3") == (
      "wide head", ["task.model.width=64", "trainer.train_steps=3"])
  assert parse("as committed:") == ("as committed", [])
  with pytest.raises(argparse.ArgumentTypeError, match="must look like 'NAME:key.sub=value"):
    parse("task.model.width=64")


def test_two_variants_of_the_toy_recipe_are_timed_in_fresh_processes(capfd, monkeypatch,
                                                                     environ):
  # The workers are child processes (run from the repository): they find toy_task on PYTHONPATH.
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [TESTS, os.environ.get(
      "PYTHONPATH")])))
  result = run_main(capfd, benchmark_script("recipe_variants").main, [
      os.path.join(TESTS, "toy.yaml"), "--import", "toy_task", "--rounds", "1", "--steps", "2",
      "--warmup", "1", "--variant", "base:", "--variant", "lr:trainer.schedule.base_lr=0.01"])
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [line for line in result.stdout.splitlines() if line.startswith(("| base ", "| lr "))]
  assert len(rows) == 2, result.stdout
  assert rows[0].endswith("| 1.00x |") and "`trainer.schedule.base_lr=0.01`" in rows[1]
  # A bad override is the worker's error, reported with the failed measurement.
  result = run_main(capfd, benchmark_script("recipe_variants").main, [
      os.path.join(TESTS, "toy.yaml"), "--import", "toy_task", "--rounds", "1", "--steps", "1",
      "--warmup", "1", "--variant", "base:", "--variant", "bad:trainer.no_such_key=1"])
  assert result.returncode == 1 and "no_such_key" in result.stderr
