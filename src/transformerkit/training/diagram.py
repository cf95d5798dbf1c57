"""``transformerkit summary TARGET --plot FILE``: the model drawn as a graph of its parts.

``keras.utils.plot_model`` draws a subclassed model (all of ours) as a single box, so this
draws the structure the models declare instead: each group of :meth:`components`
(embeddings, encoder, decoder, output head) is a cluster, each layer a box with its name,
class, parameter count and, for a block, its sublayers' counts; arrows follow the data, as the
paper's Figure 1: source ids -> embedding -> positions -> encoder blocks -> memory, which
every decoder block's cross-attention reads; target ids -> embedding -> positions ->
decoder blocks -> output projection (or the tied embedding matrix) -> logits.

The graph is built with ``pydot`` (optional extra ``diagram``); ``.dot`` files are written
by pydot alone, ``.png``/``.svg``/``.pdf`` are rendered by Graphviz's ``dot`` program.
"""

import os
import shutil

from transformerkit.extras import MissingExtra, require
from transformerkit.files import atomic_path
from transformerkit.training.summary import count_parameters, parameter_summary

RENDERED = (".png", ".svg", ".pdf")
FORMATS = (".dot", *RENDERED)
_SUBLAYERS = ("self_attention", "cross_attention_layer", "feedforward")


class DiagramUnavailable(OSError):
    """pydot or Graphviz is missing; the message says what to install."""


def _pydot():
    try:
        return require("pydot", "drawing the model")
    except MissingExtra as err:
        raise DiagramUnavailable(str(err)) from None


def _label(layer):
    """``name / Class / N parameters`` (a block: its sublayers' parameters too)."""
    lines = [layer.name, type(layer).__name__, f"{count_parameters(layer):,} parameters"]
    parts = [f"{name.removesuffix('_layer')}: {count_parameters(getattr(layer, name)):,}"
             for name in _SUBLAYERS if getattr(layer, name, None) is not None]
    return "\\n".join(lines + parts)


def _streams(model, components):
    """The chains of layers the data flows through, in order, and the layers whose output
    feeds every cross-attention (the encoder's last layer)."""
    head = components.get("output_head", [])
    if hasattr(model, "encoder_blocks"):  # Transformer: a source and a target stream
        source = [model.source_embedding, model.source_positions, *components["encoder"]]
        target = [model.target_embedding, model.target_positions, *components["decoder"],
                  *head]
        return [("source ids (batch, source_len)", source),
                ("target ids (batch, target_len)", target)], source[-1]
    stream = [*components["embeddings"], *components.get("encoder", []),
              *components.get("decoder", []), *head]
    return [("token ids (batch, len)", stream)], None


def model_graph(model):
    """A ``pydot.Dot`` of ``model`` (a built ``Transformer``, ``GPT`` or ``Encoder``): one
    node per distinct layer of ``model.components()`` (a tied embedding once), whose
    parameter counts add up to the total of :func:`~transformerkit.training.summary.
    parameter_summary` (fixed positional tables are not parameters)."""
    pydot = _pydot()
    total = parameter_summary(model)["total"]  # builds the model if needed
    components = model.components()
    graph = pydot.Dot("model", graph_type="digraph", rankdir="TB", fontname="Helvetica",
                      label=f"{type(model).__name__}: {total:,} parameters",
                      labelloc="t")
    names = {}  # id(layer) -> node name
    for group, layers in components.items():
        cluster = pydot.Cluster(group, label=group.replace("_", " "), style="rounded",
                                color="gray60", fontname="Helvetica")
        for layer in layers:
            if id(layer) in names:
                continue
            names[id(layer)] = f"layer{len(names)}"
            cluster.add_node(pydot.Node(names[id(layer)], label=_label(layer), shape="box",
                                        style="rounded", fontname="Helvetica", fontsize="10"))
        graph.add_subgraph(cluster)
    streams, memory = _streams(model, components)
    for number, (inputs, chain) in enumerate(streams):
        graph.add_node(pydot.Node(f"input{number}", label=inputs, shape="plaintext"))
        previous = f"input{number}"
        for layer in chain:
            graph.add_edge(pydot.Edge(previous, names[id(layer)]))
            previous = names[id(layer)]
        outputs = _output_label(model)
        if number == len(streams) - 1:
            graph.add_node(pydot.Node("output", label=outputs, shape="plaintext"))
            if not components.get("output_head") and hasattr(model, "tie_embeddings"):
                embedding = chain[0]  # tied: logits = x E^T with the embedding matrix
                graph.add_edge(pydot.Edge(previous, names[id(embedding)], style="dotted",
                                          label="tied projection", fontsize="9",
                                          constraint="false"))
            graph.add_edge(pydot.Edge(previous, "output"))
    if memory is not None:
        for block in components["decoder"]:
            if getattr(block, "cross_attention_layer", None) is not None:
                graph.add_edge(pydot.Edge(names[id(memory)], names[id(block)], style="dashed",
                                          label="memory", fontsize="9", constraint="false"))
    return graph


def _output_label(model):
    if getattr(model, "classifier", None) is not None:
        return f"class logits (batch, {model.num_classes})"
    if getattr(model, "pooling", None):
        return "pooled (batch, d_model)"
    if type(model).__name__ == "Encoder":
        return "hidden states (batch, len, d_model)"
    vocab = getattr(model, "target_vocab_size", None) or model.vocab_size
    return f"logits (batch, len, {vocab})"


def check_format(path):
    """The lower-case suffix of ``path`` if it is one of :data:`FORMATS`, else ValueError."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in FORMATS:
        raise ValueError(f"--plot writes {', '.join(FORMATS)} files; got {os.fspath(path)!r}")
    return suffix


def write_diagram(model, path):
    """Write ``model``'s graph to ``path``: ``.dot`` (Graphviz source; pydot only) or
    ``.png``/``.svg``/``.pdf`` (rendered by Graphviz's ``dot``). Atomic. Raises
    ``ValueError`` for another suffix, :class:`DiagramUnavailable` (an ``OSError``) when
    pydot or the ``dot`` program is missing."""
    suffix = check_format(path)
    if suffix in RENDERED and shutil.which("dot") is None:
        _pydot()  # the first thing to install, if both are missing
        raise DiagramUnavailable(
            f"rendering {suffix} needs Graphviz's `dot` program, which is not on PATH: install "
            "Graphviz (apt install graphviz, brew install graphviz, conda install graphviz) "
            "or write a .dot file, which needs no Graphviz")
    graph = model_graph(model)
    data = graph.to_string().encode() if suffix == ".dot" else graph.create(
        prog="dot", format=suffix[1:])
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
    return path
