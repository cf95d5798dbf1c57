"""Model options as data (``transformerkit.models.options``): constructors, ``get_config``,
the run config's ``model:`` schema and ``build_model`` all follow the option dataclasses."""

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from transformerkit import config as run_config
from transformerkit.config import resolve
from transformerkit.models import GPT, Encoder, Transformer, options
from transformerkit.models.factory import build_model

SMALL = dict(num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8)
MODELS = {  # model type -> (class, its pretrained-matrix arguments, non-default arguments)
    "transformer": (Transformer, ("source_embeddings", "target_embeddings"),
                    dict(source_vocab_size=20, target_vocab_size=16, num_layers=2, d_model=12,
                         num_heads=3, d_ff=20, dropout=0.2, max_length=10,
                         norm_position="pre", activation="gelu", positional="t2t",
                         tie_embeddings="decoder", key_dim=5, value_dim=3,
                         num_decoder_layers=1, attention_dropout=0.1, activation_dropout=0.05,
                         layer_norm_epsilon=1e-5, embeddings_trainable=False,
                         min_timescale=2.0, max_timescale=500.0,
                         source_embeddings_trainable=True, target_embeddings_trainable=False,
                         projection_trainable=False, scale_embeddings=False,
                         final_logits_bias=True)),
    "gpt": (GPT, ("embeddings",),
            dict(vocab_size=14, num_layers=2, d_model=8, num_heads=2, d_ff=16, dropout=0.1,
                 max_length=8, norm_position="post", activation="relu",
                 positional="sinusoidal", tie_embeddings="all", key_dim=3, value_dim=5,
                 attention_dropout=0.1, activation_dropout=0.1, layer_norm_epsilon=1e-6,
                 embeddings_trainable=False, scale_embeddings=True, initialization="paper",
                 use_bias=False, min_timescale=1.0, max_timescale=100.0,
                 projection_trainable=False)),
    "encoder": (Encoder, ("embeddings",),
                dict(vocab_size=14, num_layers=2, d_model=8, num_heads=2, d_ff=16, dropout=0.0,
                     max_length=8, norm_position="pre", activation="gelu",
                     positional="learned", key_dim=4, value_dim=2, attention_dropout=0.1,
                     activation_dropout=0.1, layer_norm_epsilon=1e-12, type_vocab_size=2,
                     embedding_norm=True, scale_embeddings=False, pooling="cls",
                     num_classes=3, embeddings_trainable=False, min_timescale=1.0,
                     max_timescale=1.0e4)),
}


@pytest.mark.parametrize("kind", MODELS)
def test_get_config_is_the_constructor_arguments(kind):
    cls, _, arguments = MODELS[kind]
    model = cls(**arguments)
    config = model.get_config()
    assert {k: config[k] for k in arguments} == arguments
    assert set(config) - set(arguments) == {"name", "trainable", "dtype"}
    assert all(getattr(model, k) == v for k, v in arguments.items())
    assert cls.from_config(config).get_config() == config


@pytest.mark.parametrize("kind", MODELS)
def test_constructor_signature_is_the_options(kind):
    """The public signature (kept explicit) has the options' names and defaults, plus the
    pretrained matrices and Keras' ``**kwargs``."""
    cls, arrays, _ = MODELS[kind]
    parameters = inspect.signature(cls).parameters
    assert list(parameters)[-1] == "kwargs"
    assert all(parameters[name].default is None for name in arrays)
    fields = {f.name: f.default for f in dataclasses.fields(options.MODEL_OPTIONS[kind])}
    assert {name: p.default for name, p in parameters.items()
            if name not in (*arrays, "kwargs")} == {
        name: (inspect.Parameter.empty if default is dataclasses.MISSING else default)
        for name, default in fields.items()}


def test_derived_values_and_types():
    opts = options.TransformerOptions(source_vocab_size=np.int64(10), target_vocab_size=10,
                                      d_model=12, num_heads=3, dropout=0, num_layers=2)
    assert (opts.key_dim, opts.value_dim, opts.num_decoder_layers) == (4, 4, 2)
    assert type(opts.source_vocab_size) is int and type(opts.dropout) is float
    assert options.GPTOptions(vocab_size=5, key_dim=6).value_dim == 6


def test_config_schema_model_keys_are_the_options():
    schema = run_config.schema()["model"]
    fields = {f.name: options.value_type(f) for cls in options.MODEL_OPTIONS.values()
              for f in options.config_fields(cls)}
    assert set(schema) == {*fields, "type", "pretrained_embeddings", "embeddings", "pretrained"}
    assert all(schema[name][1] is kind for name, kind in fields.items())
    assert run_config.SCHEMA is run_config.schema()
    assert set(run_config.MODEL_TYPES) == set(options.MODEL_OPTIONS)
    defaults = run_config.defaults()["model"]  # the paper's sizes; conventions left to the model
    assert (defaults["num_layers"], defaults["d_model"], defaults["max_length"]) == (6, 512, 256)
    assert defaults["norm_position"] is None and defaults["scale_embeddings"] is None


CHOICES = [(kind, f.name) for kind, cls in options.MODEL_OPTIONS.items()
           for f in dataclasses.fields(cls) if f.metadata.get("choices")]


@pytest.mark.parametrize("kind, name", CHOICES)
def test_bad_choice_is_a_value_error_naming_it(kind, name):
    cls, _, arguments = MODELS[kind]
    with pytest.raises(ValueError, match=rf"{name} must be one of .*; got 'bogus'"):
        cls(**{**arguments, name: "bogus"})


def test_unknown_constructor_argument_errors_as_keras_does():
    with pytest.raises(ValueError, match=r"Unrecognized keyword arguments passed to Model"):
        keras.Model(num_layer=2)
    with pytest.raises(ValueError, match=r"Unrecognized keyword arguments passed to "
                                         r"Transformer: \{'num_layer': 2\}"):
        Transformer(10, 10, num_layer=2, **SMALL)
    with pytest.raises(ValueError, match=r"passed to GPT: \{'pooling': 'cls'\}"):
        GPT(10, pooling="cls", **SMALL)


def test_choices_agree_with_the_layers():
    from transformerkit.layers.blocks import NORM_POSITIONS
    from transformerkit.layers.embeddings import POSITIONAL_KINDS
    from transformerkit.layers.feedforward import ACTIVATIONS

    assert options.NORM_POSITIONS == NORM_POSITIONS
    assert options.POSITIONAL_KINDS == POSITIONAL_KINDS
    assert options.ACTIVATIONS == ACTIVATIONS


def test_options_and_config_import_no_keras():
    path = Path(options.__file__)
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('options', {str(path)!r})\n"
            "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "import transformerkit.config\n"
            "assert 'keras' not in sys.modules, 'keras imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_build_model_takes_each_type_its_own_options():
    section = resolve({"model": {"type": "encoder", "pooling": "mean", "num_classes": 3,
                                 "type_vocab_size": 2, **SMALL}}).model
    encoder = build_model(section, 30)
    assert (encoder.pooling, encoder.num_classes, encoder.type_vocab_size) == ("mean", 3, 2)
    section = resolve({"model": {"type": "transformer", "pooling": "mean", **SMALL}}).model
    with pytest.raises(ValueError, match="model.pooling applies to model.type encoder only, "
                                         "not 'transformer'"):
        build_model(section, 30, 30)
    section = resolve({"model": {"type": "transformer", "initialization": "paper", **SMALL}})
    with pytest.raises(ValueError, match="model.initialization applies to model.type gpt "
                                         "only"):
        build_model(section.model, 30, 30)
    section = resolve({"model": {"type": "transformer", "activation": "swish",
                                 "positional": "sinusoidal_split", "scale_embeddings": False,
                                 "final_logits_bias": True, **SMALL}}).model
    marian_like = build_model(section, 30, 30)  # Marian's options, from a config
    assert (marian_like.activation, marian_like.positional, marian_like.source_embedding.scale,
            marian_like.logits_bias is not None) == ("swish", "sinusoidal_split", False, True)
    section = resolve({"model": {"type": "gpt", "norm_position": "post", **SMALL}}).model
    gpt = build_model(section, 30)
    assert (gpt.norm_position, gpt.activation, gpt.d_model) == ("post", "gelu", 8)
