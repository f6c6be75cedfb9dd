"""A tiny third-party tpu_models family: a linear model, a regression task and its data.

Nothing here is imported by `import tpu_models`; tpu_models reads `family.py`
through the `tpu_models.families` entry point (pyproject.toml) and imports
`tasks.py` the first time one of its names is looked up.
"""
