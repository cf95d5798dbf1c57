"""PNG figures: training curves from ``history.csv`` and attention heatmaps per head.

Matplotlib's object API with the Agg canvas (no ``pyplot``, no global state, no display
needed). Figures have a fixed size in pixels: ``width_in * dpi`` by ``height_in * dpi``
(never ``bbox_inches="tight"``, which would change it).
"""

import csv
import math
import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from transformerkit.files import atomic_path

DPI = 100
HISTORY_SIZE = (12.0, 4.0)  # inches: 1200 x 400 pixels at DPI
HEAD_PANEL = 3.0  # inches per attention head panel (plus a title strip)
TITLE_STRIP = 0.6


def read_history(path):
    """``history.csv`` (Keras ``CSVLogger``) -> ``{column: [float or None per epoch]}``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no training history at {path}")
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path} holds no epoch yet")
    columns = {}
    for key in rows[0]:
        values = []
        for row in rows:
            try:
                values.append(float(row[key]))
            except (TypeError, ValueError):
                values.append(None)  # "NA" or empty: not logged that epoch
        columns[key] = values
    return columns


def _save(figure, out):
    out = os.fspath(out)
    FigureCanvasAgg(figure)
    with atomic_path(out) as tmp:
        figure.savefig(tmp, format="png", dpi=DPI)
    return out


def _panels(columns):
    """Groups of curves: each training metric with its ``val_`` twin; other columns alone."""
    names = [k for k in columns if k != "epoch" and any(v is not None for v in columns[k])]
    groups, used = [], set()
    for name in names:
        if name in used or name.startswith("val_") and name[4:] in names:
            continue
        group = [name] + ([f"val_{name}"] if f"val_{name}" in names else [])
        used.update(group)
        groups.append(group)
    return groups


def plot_history(history_csv, out, title=None):
    """Training curves of a run: loss, masked accuracy, learning rate, BLEU ... one panel
    per metric (training and validation together), against the epoch. Writes a
    1200 x 400 PNG to ``out`` and returns its path."""
    columns = read_history(history_csv)
    epochs = [int(e) + 1 for e in columns.get("epoch", range(len(next(iter(columns.values())))))]
    groups = _panels(columns)[:4] or [[]]
    figure = Figure(figsize=HISTORY_SIZE, dpi=DPI, layout="constrained")
    axes = figure.subplots(1, len(groups), squeeze=False)[0]
    for ax, group in zip(axes, groups, strict=True):
        for name in group:
            points = [(e, v) for e, v in zip(epochs, columns[name], strict=True) if v is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
                    label="validation" if name.startswith("val_") else "training")
        ax.set_title(group[0] if group else "(nothing logged)")
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if len(group) > 1:
            ax.legend()
    if title:
        figure.suptitle(title)
    return _save(figure, out)


def plot_learning_rate(rates, out, title=None):
    """The learning rate of every optimizer update, ``rates`` ``(steps,)``, against the
    update (counted from 1, as the paper's schedule counts). Writes a 1200 x 400 PNG to
    ``out`` and returns its path."""
    if len(rates) == 0:
        raise ValueError("no learning rates to plot (steps must be positive)")
    figure = Figure(figsize=HISTORY_SIZE, dpi=DPI, layout="constrained")
    ax = figure.subplots()
    ax.plot(range(1, len(rates) + 1), rates)
    peak = max(range(len(rates)), key=rates.__getitem__)
    ax.annotate(f"peak {rates[peak]:.3g} at step {peak + 1}", (peak + 1, rates[peak]),
                textcoords="offset points", xytext=(8, -12))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    return _save(figure, out)


def attention_figure_size(num_heads, columns=4):
    """``(width, height)`` in pixels of :func:`plot_attention`'s figure."""
    cols = min(columns, num_heads)
    rows = math.ceil(num_heads / cols)
    return int(round(cols * HEAD_PANEL * DPI)), int(round((rows * HEAD_PANEL + TITLE_STRIP) * DPI))


def plot_attention(weights, query_tokens, key_tokens, out, title=None, columns=4):
    """One heatmap per head of ``weights`` ``(heads, queries, keys)``; rows labelled with
    ``query_tokens``, columns with ``key_tokens``. Writes a PNG of
    :func:`attention_figure_size` pixels to ``out`` and returns its path."""
    heads, queries, keys = weights.shape
    if len(query_tokens) != queries or len(key_tokens) != keys:
        raise ValueError(f"weights are {queries} x {keys} but got {len(query_tokens)} query and "
                         f"{len(key_tokens)} key labels")
    width, height = attention_figure_size(heads, columns)
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    cols = min(columns, heads)
    rows = math.ceil(heads / cols)
    axes = figure.subplots(rows, cols, squeeze=False)
    font = max(4, min(9, int(220 / max(queries, keys, 1))))
    top = float(weights.max()) or 1.0  # one colour scale for all heads
    for head in range(rows * cols):
        ax = axes[head // cols][head % cols]
        if head >= heads:
            ax.axis("off")
            continue
        ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=top, aspect="auto")
        ax.set_title(f"head {head}", fontsize=9)
        ax.set_xticks(range(keys), labels=key_tokens, rotation=90, fontsize=font)
        ax.set_yticks(range(queries), labels=query_tokens, fontsize=font)
    if title:
        figure.suptitle(title)
    return _save(figure, out)
