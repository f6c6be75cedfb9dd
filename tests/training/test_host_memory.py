"""TF 2.21 pins glibc's mmap threshold when a distributed iterator is built; we undo it.

Checked in a fresh subprocess (the allocator settings are process-wide): whether
glibc serves a 1 MiB block with its own mmap (a fresh, page-faulted mapping on
every allocation) after a `tf.distribute` iterator exists, before and after
`restore_malloc_thresholds()`. The step-time effect is in benchmarks/README.md.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = r"""
import ctypes, json, tensorflow as tf
from tpu_models.training import host_memory

libc = ctypes.CDLL("libc.so.6")
class MallInfo2(ctypes.Structure):  # glibc >= 2.33
  _fields_ = [(name, ctypes.c_size_t) for name in (
      "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
      "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def is_mmapped(size):
  # A chunk glibc serves with its own mmap shows up in hblks (mmapped chunks).
  before = libc.mallinfo2().hblks
  pointer = libc.malloc(size)
  mmapped = libc.mallinfo2().hblks > before
  libc.free(pointer)
  return mmapped

strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
dataset = strategy.distribute_datasets_from_function(lambda ctx: tf.data.Dataset.range(4))
next(iter(dataset))  # Builds a GeneratorDataset kernel: TF 2.21 pins the threshold here.
pinned = is_mmapped(1 << 20)
restored = host_memory.restore_malloc_thresholds()
print(json.dumps({"pinned": pinned, "restored": restored, "mib_after": is_mmapped(1 << 20),
                  "big_after": is_mmapped(64 << 20)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_buffers_come_from_the_heap_again_after_restoring():
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, timeout=300,
                       capture_output=True, text=True).stdout
  result = json.loads(out.strip().splitlines()[-1])
  assert result["restored"] is True
  assert result["pinned"] == tf_pins_threshold(), result  # TF 2.21: 1 MiB went to mmap.
  assert not result["mib_after"], result  # Now from the heap, reused without page faults.
  assert result["big_after"], result  # Beyond 32 MiB glibc still maps (and returns) memory.


def tf_pins_threshold() -> bool:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.__version__.startswith("2.21")
