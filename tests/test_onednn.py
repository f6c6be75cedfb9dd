"""The CLI's oneDNN default: TF_ENABLE_ONEDNN_OPTS=1 on x86-64 before TensorFlow loads."""

import os
import platform
import subprocess
import sys

import pytest

from tpu_models import onednn


@pytest.fixture
def tensorflow_not_imported(monkeypatch):
  """default_on() as the CLI sees it: before TensorFlow is imported."""
  monkeypatch.delitem(sys.modules, "tensorflow", raising=False)


@pytest.mark.parametrize("machine", ["x86_64", "AMD64"])
def test_default_on_sets_the_variable_on_x86_64(tensorflow_not_imported, machine):
  environ = {}
  assert onednn.default_on(environ, machine=machine, cpus=2)
  assert environ == {"TF_ENABLE_ONEDNN_OPTS": "1"}


def test_default_on_needs_two_cpus(tensorflow_not_imported):
  """One intra-op thread with oneDNN forced on corrupted TensorFlow's heap (AVX2 CPU)."""
  environ = {}
  assert not onednn.default_on(environ, machine="x86_64", cpus=1)
  assert environ == {}


def test_child_environ_follows_the_childs_cpus_and_the_users_value():
  """What a sweep gives its trial processes: the default for their CPUs, not the driver's."""
  assert onednn.child_environ(2, "x86_64", user_environ={}) == {"TF_ENABLE_ONEDNN_OPTS": "1"}
  assert onednn.child_environ(1, "x86_64", user_environ={}) == {}  # TensorFlow's own choice.
  assert onednn.child_environ(4, "aarch64", user_environ={}) == {}
  # The user's value, "0" included, reaches the child by inheritance: nothing to add.
  assert onednn.child_environ(4, "x86_64", user_environ={"TF_ENABLE_ONEDNN_OPTS": "0"}) == {}


@pytest.mark.parametrize("value", ["0", "1", ""])
def test_default_on_keeps_the_users_value(tensorflow_not_imported, value):
  environ = {"TF_ENABLE_ONEDNN_OPTS": value}
  assert not onednn.default_on(environ, machine="x86_64", cpus=2)
  assert environ == {"TF_ENABLE_ONEDNN_OPTS": value}


def test_default_on_leaves_other_machines_alone(tensorflow_not_imported):
  environ = {}
  assert not onednn.default_on(environ, machine="aarch64", cpus=2)
  assert environ == {}


def test_default_on_does_nothing_once_tensorflow_is_imported():
  import tensorflow  # noqa: F401  pylint: disable=unused-import,g-import-not-at-top
  environ = {}
  assert not onednn.default_on(environ, machine="x86_64", cpus=2)
  assert environ == {}


_PROBE = ("import sys; from tpu_models import cli, onednn; "
          "code = cli.main(['list', 'tasks']); print('oneDNN', onednn.enabled()); sys.exit(code)")


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64") or
                    onednn.usable_cpus() < onednn.MIN_THREADS,
                    reason="the default applies to x86-64 with 2 CPUs or more")
@pytest.mark.parametrize("value, expected", [(None, True), ("0", False)])
def test_the_cli_runs_tensorflow_with_onednn_unless_told_not_to(value, expected):
  """Whatever the CPU kind: TensorFlow's own default differs between them, the CLI's not."""
  env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
  if value is not None:
    env["TF_ENABLE_ONEDNN_OPTS"] = value
  done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr
  assert done.stdout.splitlines()[-1] == f"oneDNN {expected}"
