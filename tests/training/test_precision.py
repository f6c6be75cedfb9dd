"""`runtime.mixed_precision: auto`: the decision from faked device descriptions and CPU flags
(never from this machine's CPU), and the Trainer using what it resolved to."""

import pytest

import toy_task
from tpu_models.training import precision
from tpu_models.training.trainer import Trainer

AVX2_ONLY = "fpu sse4_2 avx avx2 fma f16c bmi2".split()
SAPPHIRE_RAPIDS = AVX2_ONLY + "avx512f avx512bw avx512_bf16 amx_tile amx_bf16 amx_int8".split()


@pytest.mark.parametrize("device,kwargs,expected,reason", [
    ("tpu", {}, "bfloat16", "TPUs compute bfloat16 natively"),
    ("gpu", {"gpu_compute_capabilities": [(8, 0)]}, "bfloat16", "compute capability 8.0 >= 8.0"),
    ("gpu", {"gpu_compute_capabilities": [(9, 0), (7, 5)]}, "float32", "7.5 < 8.0"),
    ("gpu", {}, "float32", "compute capability is unknown"),
    ("cpu", {"cpu_flags": AVX2_ONLY}, "float32", "neither AVX512_BF16 nor AMX"),
    ("cpu", {"cpu_flags": AVX2_ONLY + ["avx512f", "avx512_vnni"]}, "float32", "neither"),
    ("cpu", {"cpu_flags": AVX2_ONLY + ["avx512_bf16"]}, "bfloat16", "(avx512_bf16)"),
    ("cpu", {"cpu_flags": SAPPHIRE_RAPIDS}, "bfloat16", "(amx_bf16, avx512_bf16)"),
    ("cpu", {"cpu_flags": SAPPHIRE_RAPIDS, "onednn_max_isa": "AVX2"}, "float32",
     "ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN from"),
    ("cpu", {"cpu_flags": SAPPHIRE_RAPIDS, "onednn_max_isa": "avx512_core_amx"}, "bfloat16",
     "natively"),
    ("cpu", {"cpu_flags": None}, "float32", "cannot tell"),
])
def test_auto_picks_bfloat16_only_where_it_is_native(device, kwargs, expected, reason):
  chosen, why = precision.choose_precision(device, **kwargs)
  assert chosen == expected
  assert reason in why


def test_cpu_flags_are_read_from_a_cpuinfo_file(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\n"
                     "processor\t: 1\nflags\t\t: fpu avx2 fma\n")
  assert precision.linux_cpu_flags(str(cpuinfo)) == frozenset({"fpu", "avx2", "fma"})
  assert precision.linux_cpu_flags(str(tmp_path / "missing")) is None  # Not Linux: unknown.


def test_explicit_values_are_kept():
  assert precision.resolve_precision("bfloat16", "cpu") == ("bfloat16", "")
  assert precision.resolve_precision("float32", "tpu") == ("float32", "")


@pytest.mark.parametrize("flags,expected", [(AVX2_ONLY, "float32"),
                                            (SAPPHIRE_RAPIDS, "bfloat16")])
def test_trainer_builds_the_model_in_the_precision_auto_chose(tmp_path, monkeypatch, environ,
                                                              flags, expected):
  monkeypatch.setattr(precision, "linux_cpu_flags", lambda *a, **k: frozenset(flags))
  monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
  config = toy_task.toy_config(["runtime.mixed_precision=auto", "trainer.train_steps=1"])
  trainer = Trainer(config, str(tmp_path / "run"), stream=open(tmp_path / "log", "w"))
  assert trainer.mixed_precision == expected
  hidden = trainer.model.get_layer("hidden")
  assert hidden.compute_dtype == expected and hidden.variable_dtype == "float32"
  assert f"| {expected} |" in trainer.describe()
  trainer.close()
  assert f"runtime.mixed_precision auto: {expected} (" in (tmp_path / "log").read_text()
