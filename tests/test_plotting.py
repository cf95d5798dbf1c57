"""PNG figures: training curves and attention heatmaps are valid PNGs of the promised size."""

import math
import struct

import numpy as np
import pytest
import tolerances as tol

from transformerkit.plotting import (
    DPI,
    HISTORY_SIZE,
    attention_figure_size,
    plot_attention,
    plot_history,
    read_history,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The float32 schedules: eq. 3's rsqrt, its constants rounded to float32 and products; the
# cosine's ratio, pi * ratio, cos, its sums and products, on terms of at most pi * peak.
PAPER_ROUNDINGS = tol.ELEMENTWISE_ULPS + 5
COSINE_ROUNDINGS = tol.ELEMENTWISE_ULPS + 8


def png_size(path):
    """(width, height) from the PNG header, after checking the signature and IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(33)
    assert head[:8] == PNG_SIGNATURE, "not a PNG file"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def write_history(path, rows, header="epoch,loss,masked_accuracy,val_loss,val_bleu"):
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def test_history_plot_is_a_png_of_the_expected_size(tmp_path):
    csv = write_history(tmp_path / "history.csv",
                        ["0,5.1,0.20,4.8,NA", "1,4.2,0.31,4.0,3.5", "2,3.6,0.40,3.7,7.9"])
    out = plot_history(csv, tmp_path / "plots" / "history.png", title="run")
    assert png_size(out) == (int(HISTORY_SIZE[0] * DPI), int(HISTORY_SIZE[1] * DPI))


def test_read_history_keeps_missing_values_as_none(tmp_path):
    csv = write_history(tmp_path / "h.csv", ["0,5.1,0.2,4.8,NA", "1,4.2,0.3,4.0,3.5"])
    columns = read_history(csv)
    assert columns["val_bleu"] == [None, 3.5] and columns["loss"] == [5.1, 4.2]


def test_history_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        plot_history(tmp_path / "missing.csv", tmp_path / "x.png")
    empty = write_history(tmp_path / "empty.csv", [])
    with pytest.raises(ValueError, match="no epoch"):
        plot_history(empty, tmp_path / "x.png")


@pytest.mark.parametrize("heads", [8, 3, 1])
def test_attention_plot_is_a_png_of_the_expected_size(tmp_path, heads):
    rng = np.random.default_rng(0)
    weights = rng.random((heads, 4, 6))
    weights /= weights.sum(-1, keepdims=True)
    out = plot_attention(weights, ["A", "▁dog", "▁runs", "</s>"],
                         ["Ein", "▁Hund", "▁läuft", "▁im", "▁Schnee", "</s>"],
                         tmp_path / f"att{heads}.png", title="cross attention, layer 0")
    assert png_size(out) == attention_figure_size(heads)
    cols = min(4, heads)
    assert attention_figure_size(heads)[0] == cols * 300


def test_attention_labels_must_match_the_weights(tmp_path):
    with pytest.raises(ValueError, match="4 query"):
        plot_attention(np.ones((2, 3, 5)) / 5, list("abcd"), list("abcde"), tmp_path / "x.png")


def _paper_rate(step, d_model, warmup, scale):
    """Paper eq. 3 in float64, ``step`` counted from 1."""
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def _cosine_rate(it, peak, warmup, decay, minimum):
    """nanoGPT's get_lr in float64, ``it`` counted from 0."""
    if it < warmup:
        return peak * (it + 1) / (warmup + 1)
    ratio = min(max((it - warmup) / max(decay - warmup, 1), 0.0), 1.0)
    return minimum + 0.5 * (1 + math.cos(math.pi * ratio)) * (peak - minimum)


def test_learning_rates_follow_the_papers_schedule_and_nanogpts():
    from transformerkit.config import resolve
    from transformerkit.training.trainer import learning_rates

    paper = resolve({"model": {"d_model": 64},
                     "train": {"warmup_steps": 30, "lr_scale": 0.5}})
    np.testing.assert_allclose(learning_rates(paper, 100),
                               [_paper_rate(s, 64, 30, 0.5) for s in range(1, 101)],
                               rtol=tol.relative(PAPER_ROUNDINGS))
    cosine = resolve({"model": {"type": "gpt", "d_model": 32},
                      "data": {"dataset": "text", "text": "x.txt"},
                      "train": {"optimizer": "adamw_cosine", "learning_rate": 1e-3,
                                "warmup_steps": 10, "min_learning_rate": 1e-4}})
    tol.assert_within(learning_rates(cosine, 80),
                      [_cosine_rate(i, 1e-3, 10, 80, 1e-4) for i in range(80)],
                      tol.gamma(COSINE_ROUNDINGS) * math.pi * 1e-3)
    constant = resolve({"train": {"learning_rate": 0.003}})
    # 0.003 rounded to float32 once (the optimizer's variable)
    np.testing.assert_allclose(learning_rates(constant, 5), [0.003] * 5, rtol=tol.relative(1))
    with pytest.raises(ValueError, match="steps must be positive"):
        learning_rates(constant, 0)


def test_plot_lr_command_writes_the_schedule(tmp_path, capsys):
    from transformerkit.cli import main

    config = tmp_path / "c.yaml"
    config.write_text("model: {d_model: 64}\ntrain: {warmup_steps: 40}\n")
    out = tmp_path / "lr.png"
    assert main(["plot", str(config), "--lr", "--steps", "200", "--out", str(out)]) == 0
    assert png_size(out) == (1200, 400)
    assert "200 steps, peak 0.0198 at step 40" in capsys.readouterr().out  # 64^-.5 40^-.5
    # no max_steps, no --steps (e.g. a time budget): 4 x warmup_steps are drawn (the paper
    # schedule is the same whatever the length), the assumption and the cooldown said
    assert main(["plot", str(config), "--lr", "--set", "train.time_budget=10m", "--out",
                 str(out)]) == 0
    said = capsys.readouterr().out
    assert "160 steps, peak 0.0198 at step 40); the config sets no length" in said
    assert "the last 20% cooled down to zero" in said
    assert main(["plot", str(config), "--lr", "--set", "train.time_budget=10m", "--set",
                 "train.cooldown=0", "--out", str(out)]) == 0
    assert "does not depend on the run's length" in capsys.readouterr().out
    cosine = tmp_path / "cosine.yaml"
    cosine.write_text("train: {optimizer: adamw_cosine, time_budget: 10m}\n")
    assert main(["plot", str(cosine), "--lr"]) == 2  # its decay needs the run's length
    assert "give --steps N" in capsys.readouterr().err
