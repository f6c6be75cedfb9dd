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
  cli.py        `tpu-models weights list|import`, `tpu-models migrate model-garden`.

Nothing here downloads: a catalogue entry records where a user downloads
its file, and a missing file is an error that prints that location.
"""
