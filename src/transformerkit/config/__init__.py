"""Run configuration: the YAML sections ``model``, ``data``, ``train`` and (optional)
``search``, validated into a typed :class:`RunConfig`.

Every key has a default, a type and a one-line meaning, declared once: the ``data`` and
``train`` keys are the fields of :class:`DataOptions` and :class:`TrainOptions`
(``config/sections.py``), the ``model`` keys the models' option dataclasses of
:mod:`transformerkit.models.options`, the ``search`` keys the fields of
:class:`~transformerkit.decoding.options.SearchOptions` (how the run translates unless told
otherwise). :func:`schema` lists them; :func:`load_config` reads a
file into a :class:`RunConfig` (``config.train.epochs``, ``config.data.tokenizer``,
``config.model.d_model``); unknown keys and wrong types are errors that name the key.
``--set section.key=value`` overrides parse ``value`` as YAML (``--set train.epochs=3``,
``--set model.norm_position=pre``). :func:`describe` prints a resolved config with every
key's type, default and meaning (``transformerkit config``). :func:`save_config` writes
``RUN/config.yaml`` (:meth:`RunConfig.to_dict`), which :func:`load_config` reads back.

The modules: ``sections.py`` (the declarations and the check of one value), ``loading.py``
(reading, the checks across keys, :class:`RunConfig`), ``describe.py`` (the printed
config). Plain Python: importing this package imports neither Keras nor the models.
"""

from transformerkit.config.describe import describe
from transformerkit.config.loading import (
    MODEL_TYPES,
    SECTIONS,
    Key,
    ModelSection,
    RunConfig,
    defaults,
    load_config,
    parse_duration,
    resolve,
    save_config,
    schema,
)
from transformerkit.config.sections import (
    DATASETS,
    DISTRIBUTIONS,
    OPTIMIZERS,
    SAMPLE_UNITS,
    STOPPING_METRICS,
    TRAIN_POLICIES,
    ConfigError,
    DataOptions,
    TrainOptions,
)

__all__ = ["DATASETS", "DISTRIBUTIONS", "MODEL_TYPES", "OPTIMIZERS", "TRAIN_POLICIES",
           "SAMPLE_UNITS", "SECTIONS", "STOPPING_METRICS", "ConfigError", "DataOptions", "Key",
           "ModelSection", "RunConfig", "TrainOptions", "defaults", "describe", "load_config",
           "parse_duration", "resolve", "save_config", "schema"]


def __getattr__(name):
    if name == "SCHEMA":  # built on first use, see schema()
        return schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
