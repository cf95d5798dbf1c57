"""``transformerkit summary --plot``: the model diagram (training/diagram.py) holds every
layer of ``components()`` once with counts adding up to the parameter summary, the
cross-attention edges of a Transformer, renders with Graphviz, and says what to install
when pydot or Graphviz is missing."""

import re
import shutil
import sys

import pytest

from transformerkit.cli import main
from transformerkit.models import GPT, Encoder, Transformer
from transformerkit.training import diagram
from transformerkit.training.summary import parameter_summary

pydot = pytest.importorskip("pydot")  # the `diagram` extra: installed by `make install`
# pydot's DOT parser (used here to read the graphs back) calls pyparsing's old names
pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated - use:DeprecationWarning")

SIZES = dict(num_layers=2, d_model=16, num_heads=2, d_ff=32, max_length=20)


def models():
    return {"transformer": Transformer(40, 50, tie_embeddings="none", **SIZES),
            "tied": Transformer(40, 40, tie_embeddings="all", **SIZES),
            "gpt": GPT(30, **SIZES),
            "classifier": Encoder(30, pooling="cls", num_classes=3, **SIZES)}


def nodes_and_edges(graph):
    """``({node name: label}, [(source, destination, attributes)])`` of a pydot graph,
    read back from its DOT text (what Graphviz draws)."""
    parsed = pydot.graph_from_dot_data(graph.to_string())[0]
    nodes = {}
    for subgraph in [parsed, *parsed.get_subgraphs()]:
        for node in subgraph.get_nodes():
            label = node.get("label")
            if label:
                nodes[node.get_name()] = label.strip('"')
    edges = [(e.get_source(), e.get_destination(), e.get_attributes())
             for e in parsed.get_edges()]
    return nodes, edges


@pytest.mark.parametrize("kind", ["transformer", "tied", "gpt", "classifier"])
def test_every_layer_once_and_counts_add_up(kind):
    model = models()[kind]
    graph = diagram.model_graph(model)
    nodes, edges = nodes_and_edges(graph)
    layers = {id(layer): layer for group in model.components().values() for layer in group}
    boxes = {name: label for name, label in nodes.items() if name.startswith("layer")}
    assert len(boxes) == len(layers)  # a tied embedding is one box
    assert sorted(label.split("\\n")[0] for label in boxes.values()) == \
        sorted(layer.name for layer in layers.values())
    counts = [int(re.search(r"([\d,]+) parameters", label).group(1).replace(",", ""))
              for label in boxes.values()]
    total = parameter_summary(model)["total"]
    assert sum(counts) == total
    assert f"{total:,} parameters" in graph.get("label")
    # one connected chain from the inputs to the output
    assert any(dst == "output" for _, dst, _ in edges)
    reached, frontier = set(), [name for name in nodes if name.startswith("input")]
    while frontier:
        current = frontier.pop()
        reached.add(current)
        frontier += [dst for src, dst, _ in edges if src == current and dst not in reached]
    assert set(boxes) | {"output"} <= reached


def test_every_decoder_block_reads_the_encoder_memory():
    model = models()["transformer"]
    nodes, edges = nodes_and_edges(diagram.model_graph(model))
    by_layer = {label.split("\\n")[0]: name for name, label in nodes.items()}
    memory = by_layer[model.encoder_blocks[-1].name if model.encoder_norm is None
                      else model.encoder_norm.name]
    readers = {dst for src, dst, attributes in edges
               if src == memory and attributes.get("label") == "memory"}
    assert readers == {by_layer[block.name] for block in model.decoder_blocks}
    _, tied_edges = nodes_and_edges(diagram.model_graph(models()["tied"]))
    assert any("tied projection" in str(attributes.get("label")) for *_, attributes in tied_edges)


def test_summary_plot_writes_dot_and_png(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("model: {num_layers: 1, d_model: 16, num_heads: 2, d_ff: 32}\n")
    out = tmp_path / "model.dot"
    assert main(["summary", str(config), "--vocab-size", "50", "--plot", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert "cross_attention" in out.read_text() and out.read_text().startswith("digraph")
    if shutil.which("dot") is None:  # CI installs Graphviz (.ci/run); say so if it did not
        pytest.skip("Graphviz's dot is not installed: the PNG rendering is not tested")
    png = tmp_path / "model.png"
    assert main(["summary", str(config), "--vocab-size", "50", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_pydot_graphviz_or_format_are_clear_errors(tmp_path, capsys, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("model: {num_layers: 1, d_model: 16, num_heads: 2, d_ff: 32}\n")
    args = ["summary", str(config), "--vocab-size", "50", "--plot"]
    assert main([*args, str(tmp_path / "m.jpg")]) == 2
    assert ".dot, .png, .svg, .pdf" in capsys.readouterr().err
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert main([*args, str(tmp_path / "m.png")]) == 2
    assert "apt install graphviz" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "pydot", None)  # as where it is not installed
    assert main([*args, str(tmp_path / "m.dot")]) == 2
    assert ("drawing the model needs the pydot package, which is not installed (pip install "
            "\"keras-transformerkit[diagram]\")") in capsys.readouterr().err
    assert not (tmp_path / "m.dot").exists()
