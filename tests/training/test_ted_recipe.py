"""``configs/ted_pt_en.yaml`` builds the TensorFlow tutorial's model: its head width, attention
dropout, LayerNorm epsilon, no label smoothing, and its positional table exactly."""

import numpy as np
import tolerances as tol

from transformerkit.config import load_config
from transformerkit.models.factory import build_model


def tutorial_positional_encoding(length, depth):
    """The tutorial's ``positional_encoding`` in float64: angle rates 10000^(-i/(depth/2)),
    sines then cosines."""
    half = depth / 2
    positions = np.arange(length)[:, None]
    rates = 1 / 10000 ** (np.arange(half)[None, :] / half)
    angles = positions * rates
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


def test_ted_config_builds_the_tutorials_model():
    import keras

    config = load_config("configs/ted_pt_en.yaml")
    model_cfg = config.model
    assert (model_cfg["num_layers"], model_cfg["d_model"], model_cfg["d_ff"],
            model_cfg["num_heads"]) == (4, 128, 512, 8)
    assert config.train.label_smoothing == 0.0
    model = build_model(model_cfg, 50, 60)
    model.build(None)
    block = model.encoder_blocks[0]
    assert model.key_dim == 128 and model.attention_dropout == 0.1
    assert model.layer_norm_epsilon == 1e-3 and model.tie_embeddings == "none"
    assert block.get_config()["key_dim"] == 128
    # our float64 table rounded to float32 (u |x|, |x| <= 1); the two float64 formulas
    # (t2t's exp of a log increment, the tutorial's power) agree to ~1e-14 at angles <= 127
    for positions in (model.source_positions, model.target_positions):
        tol.assert_within(keras.ops.convert_to_numpy(positions.table),
                          tutorial_positional_encoding(128, 128), tol.U32 + 1e-12)
