"""The registry: a dict and a decorator, self-registering families, helpful unknown-name errors."""

import fnmatch
import json
import os
import resource
import subprocess
import sys

import pytest

import tpu_models
from tpu_models import registry
from tpu_models.registry import Family, Module

from conftest import REPO


def _python(code, *args):
  """Runs `code` in a fresh interpreter (this tree first on the path); returns its stdout."""
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def test_register_create_and_list():
  with registry.scoped():
    @registry.register_model("test_registry_double")
    def double(factor: int = 2):
      return ("double", factor)

    assert tpu_models.create_model("test_registry_double", factor=3) == ("double", 3)
    assert "test_registry_double" in tpu_models.list_models("test_registry_*")
    assert registry.MODELS.origin("test_registry_double") == __name__
  assert "test_registry_double" not in tpu_models.list_models()  # The scope restored it.
  assert "resnet50" in tpu_models.list_models()
  assert "classification" in tpu_models.list_tasks()
  assert {"tfrecord", "fashion_mnist", "tfds", "text_lines"} <= set(tpu_models.list_datasets())


def test_unknown_name_lists_close_matches():
  with pytest.raises(KeyError, match="Unknown model 'resnet5'.*Did you mean: resnet50"):
    tpu_models.create_model("resnet5")


def test_duplicate_registration_is_an_error_and_unregister_removes():
  with registry.scoped():
    registry.register_model("test_registry_dup")(lambda: 1)
    with pytest.raises(ValueError, match="already registered"):
      registry.register_model("test_registry_dup")(lambda: 2)
    registry.unregister("model", "test_registry_dup")
    assert "test_registry_dup" not in registry.MODELS
    registry.register_model("test_registry_dup")(lambda: 3)  # Free again.
    with pytest.raises(KeyError, match="Cannot unregister task 'test_registry_dup'"):
      registry.unregister("task", "test_registry_dup")


def test_scoped_restores_overwritten_entries_and_added_families():
  original = registry.MODELS.get("resnet18")
  with registry.scoped():
    registry.register_model("resnet18", overwrite=True)(lambda: "replaced")
    registry.add_family(Family("scoped_test", modules=(Module("json", models=("scoped_*",)),)))
    assert registry.MODELS.get("resnet18")() == "replaced"
    assert "scoped_test" in [f.name for f in registry.families()]
  assert registry.MODELS.get("resnet18") is original
  assert "scoped_test" not in [f.name for f in registry.families()]


def test_a_declared_module_that_does_not_exist_is_an_error():
  broken = Family("broken", modules=(Module("tpu_models.no_such_module", models=("broken_*",)),))
  with registry.scoped():
    registry.add_family(broken)
    with pytest.raises(registry.FamilyError,
                       match="Family 'broken' declares module 'tpu_models.no_such_module', "
                             "which does not exist"):
      tpu_models.create_model("broken_model")
    with pytest.raises(registry.FamilyError):  # Listing does not skip it either.
      tpu_models.list_models()
  assert "resnet50" in tpu_models.list_models()


def test_builtin_families_are_found_on_disk():
  modules = registry.builtin_family_modules()
  assert {"tpu_models.data.family", "tpu_models.text.family",
          "tpu_models.vision.classification.family",
          "tpu_models.vision.detection.family"} <= set(modules)
  for name in modules:  # Each is a family.py file of the package.
    path = os.path.join(REPO, *name.split(".")) + ".py"
    assert os.path.isfile(path), path


# Three fresh-interpreter checks in ONE child, which imports TensorFlow once (~6-8 s of CPU)
# instead of once per check: what `import tpu_models` and a lookup import (first, while the
# interpreter is fresh), the CPU time of importing TensorFlow itself (the yardstick of
# test_version_and_help_do_not_import_tensorflow), then every family imported fully and
# its registered names against its declared globs.
FRESH = r"""
import fnmatch, json, resource, sys

def cpu_seconds():
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime

out = {}
import tpu_models
out["lazy_after_import"] = "tensorflow" in sys.modules
start = cpu_seconds()
import tensorflow
out["tensorflow_cpu_seconds"] = cpu_seconds() - start
tpu_models.create_model("resnet18", num_classes=3, input_shape=[32, 32, 3], stem="small")
out["lazy_resnet"] = "tpu_models.vision.classification.resnet" in sys.modules
out["lazy_others"] = sorted(m for m in sys.modules
                            if m.startswith(("tpu_models.text.", "tpu_models.vision.detection."))
                            and not m.endswith(".family"))
out["lazy_heavy"] = [m for m in ("tensorflow_text", "pycocotools", "sacrebleu", "sentencepiece",
                                 "tensorflow_datasets") if m in sys.modules]

from tpu_models import registry
families = registry.families()
for family in families:
  registry.import_family(family)  # Every module, fully.
declared = {m.name: m for f in families for m in f.modules}
out["entries"], out["globs"] = [], []
for kind, reg in registry.REGISTRIES.items():
  names = reg.names()
  for name in names:
    out["entries"].append([kind, name, reg.origin(name)])
  for module in declared.values():
    for glob in module.globs(kind):
      out["globs"].append([kind, glob, module.name,
                           [n for n in names if fnmatch.fnmatch(n, glob)]])
out["declared"] = {name: {k: list(m.globs(k)) for k in registry.KINDS}
                   for name, m in declared.items()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh():
  return json.loads(_python(FRESH).splitlines()[-1])


def test_every_registered_name_matches_its_familys_declared_globs(fresh):
  """Globs cannot drift: a name a module registers outside its globs (or a stale glob) fails."""
  out = fresh
  assert len(out["entries"]) > 20
  for kind, name, origin in out["entries"]:
    assert origin in out["declared"], f"{kind} {name!r} registered by undeclared module {origin}"
    globs = out["declared"][origin][kind]
    assert any(fnmatch.fnmatch(name, g) for g in globs), (
        f"{kind} {name!r} (registered by {origin}) matches none of its declared {kind} globs "
        f"{globs}")
  for kind, glob, module, matched in out["globs"]:
    assert matched, f"{module} declares {kind} glob {glob!r} but registers no such {kind}"


def test_import_is_lazy_and_a_lookup_imports_only_its_family(fresh):
  after_import, resnet = fresh["lazy_after_import"], fresh["lazy_resnet"]
  others = ",".join(fresh["lazy_others"]) or "-"
  heavy = ",".join(fresh["lazy_heavy"]) or "-"
  assert after_import is False, "import tpu_models imported tensorflow"
  assert resnet is True
  assert others == "-", f"looking up resnet18 imported other families' modules: {others}"
  assert heavy == "-", f"looking up resnet18 imported optional extras: {heavy}"


def _child_cpu_seconds(args, env):
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  subprocess.run(args, cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_version_and_help_do_not_import_tensorflow(fresh):
  code = ("import sys\nfrom tpu_models import cli\nfor argv in (['--version'], ['--help']):\n"
          "  try:\n    cli.main(argv)\n  except SystemExit:\n    pass\n"
          "print('TF', 'tensorflow' in sys.modules, 'keras' in sys.modules)")
  assert _python(code).splitlines()[-1] == "TF False False"
  # CPU time, not wall-clock: a loaded machine slows both the same way.
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  version = _child_cpu_seconds([sys.executable, "-m", "tpu_models.cli", "--version"], env)
  # `import tensorflow`'s own CPU time, measured in the fresh child (without the
  # interpreter's start-up a child of its own would add: a stricter yardstick).
  tensorflow = fresh["tensorflow_cpu_seconds"]
  assert version < 0.25 * tensorflow, (version, tensorflow)
