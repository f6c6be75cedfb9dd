"""Model Garden's `sequence_beam_search` on deterministic table models; prints ONE JSON line.

Runs INSIDE benchmarks/.venv-model-garden (see setup_venv.sh), driven by
benchmarks/text/beam_search_vs_model_garden.py, which also imports
`table_symbols_to_logits_fn` from here so both sides search the very same
function (this module needs only TensorFlow at import time).

    benchmarks/.venv-model-garden/bin/python benchmarks/model_garden/beam_search_worker.py \\
        --cases cases.npz --output model_garden.npz
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top


def table_symbols_to_logits_fn(table, history, rows):
  """A deterministic "model" in the `symbols_to_logits_fn` contract of both searches.

  logits[n] = table[i, last[n]] + history[previous[n]] + rows[row[n]], where
  `last` is the newest id (read from `ids`), and `previous` (the id before it)
  and `row` (the batch row) are read from the cache only, so the result is
  right only if the search reorders the cache with its beams.

  Args:
    table: float32 [steps, vocab, vocab].
    history: float32 [vocab + 1, vocab]; row `vocab` is used at step 0.
    rows: float32 [batch, vocab].

  Returns:
    (symbols_to_logits_fn, initial_cache_fn); the cache is float32, as Model
    Garden requires it in the score dtype.
  """
  table, history, rows = (tf.constant(a, tf.float32) for a in (table, history, rows))
  vocab_size = int(table.shape[-1])

  def symbols_to_logits_fn(ids, i, cache):
    last = ids[:, -1]  # [B*beam, 1] with padded decode, [B*beam, i + 1] without.
    previous = tf.cast(cache["previous"][:, 0], tf.int32)
    previous = tf.where(previous < 0, vocab_size, previous)
    row = tf.cast(cache["row"][:, 0], tf.int32)
    logits = (tf.gather(tf.gather(table, i), last) + tf.gather(history, previous) +
              tf.gather(rows, row))
    return logits, {"previous": tf.cast(last[:, tf.newaxis], tf.float32), "row": cache["row"]}

  def initial_cache(batch_size):
    return {"previous": -tf.ones([batch_size, 1], tf.float32),
            "row": tf.cast(tf.range(batch_size), tf.float32)[:, tf.newaxis]}

  return symbols_to_logits_fn, initial_cache


def cases_from_file(path):
  """[(name, settings dict, table, history, rows)] from the driver's .npz."""
  data = np.load(path)
  settings = json.loads(str(data["settings"]))
  return [(s["name"], s, data[f"{s['name']}/table"], data[f"{s['name']}/history"],
           data[f"{s['name']}/rows"]) for s in settings]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", required=True, help=".npz written by the driver.")
  parser.add_argument("--output", required=True, help=".npz to write the results to.")
  args = parser.parse_args(argv)

  import importlib.metadata as metadata  # pylint: disable=g-import-not-at-top
  from official.nlp.modeling.ops import beam_search  # pylint: disable=g-import-not-at-top

  start = time.perf_counter()
  results = {}
  for name, s, table, history, rows in cases_from_file(args.cases):
    fn, initial_cache = table_symbols_to_logits_fn(table, history, rows)
    for padded in (True, False):
      ids, scores = beam_search.sequence_beam_search(
          fn, tf.zeros([s["batch"]], tf.int32), initial_cache(s["batch"]), s["vocab"],
          s["beam"], s["alpha"], s["length"], s["eos_id"], padded_decode=padded,
          dtype="float32")
      ids = ids.numpy()
      mode = "padded" if padded else "unpadded"
      # Without padded decode the sequences end where the search stopped.
      results[f"{name}/{mode}/steps"] = np.array(ids.shape[-1] - 1)
      ids = np.pad(ids, [[0, 0], [0, 0], [0, s["length"] + 1 - ids.shape[-1]]])
      results[f"{name}/{mode}/ids"] = ids
      results[f"{name}/{mode}/scores"] = scores.numpy()
  np.savez(args.output, **results)
  print(json.dumps({"side": "model_garden", "cases": len(results) // 6,
                    "tensorflow": tf.__version__,
                    "model_garden": metadata.version("tf-models-official"),
                    "seconds": time.perf_counter() - start}), flush=True)


if __name__ == "__main__":
  sys.exit(main())
