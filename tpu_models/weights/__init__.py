"""Pretrained weights from other libraries' files, offline.

  stores.py     a weights file or directory read as {name: numpy array}: TF2
                object-graph checkpoints, .safetensors, keras-hub presets, .pth
                (with torch only).
  mapping.py    `Source`, `NameMap`, the layout conversions and
                `assign_name_map` (all variables found, all tensors used or
                ignored, shapes equal; else one line naming the first misfit).
  catalogue.py  the importer registry ((source format, family) -> name-map
                builder) and the catalogue of named public weights; the
                families fill both in their `pretrained.py`.
  importing.py  `load_weights`, `import_weights` (a model_dir from a catalogue
                entry and a downloaded file), `write_model_dir`.
  fetch.py      one published file into the cache (TPU_MODELS_HOME): verified by
                SHA-256 (or the published prefix) and size, resumed with Range,
                locked, mirrored, offline-aware; standard library only.
  cache.py      `get(NAME)`: an entry's cached model_dir, fetched and imported when missing.
  cli.py        `tpu-models weights list|get|cache|import`, `tpu-models migrate model-garden`.

A catalogue entry records where its file is published and the hash the
publisher gives (`RemoteFile`); only `weights get`, `cache.get` and
`create_model(..., weights=NAME)` download, never a test or an import.
"""
