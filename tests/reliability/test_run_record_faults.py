"""Fault injection on what a run depends on and records: the precision `auto` picks on CPUs
with and without native bfloat16 (flags faked through the fault driver)."""

import os

import pytest

import toy_task  # noqa: F401  (registers the toy task)
from conftest import REPO
from faults import run_batch

TOY = os.path.join(REPO, "tests", "toy.yaml")
AVX2_ONLY = "fpu sse4_2 avx avx2 fma f16c bmi2"
AMX = AVX2_ONLY + " avx512f avx512bw avx512_bf16 amx_tile amx_bf16"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("run_record_faults")

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
  }
  names = list(cases)
  outcome = dict(zip(names, run_batch(tmp, [cases[n] for n in names])))
  outcome["tmp"] = tmp
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
