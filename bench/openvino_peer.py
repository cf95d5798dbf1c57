"""OpenVINO as a peer system of the decoding benchmarks (``ov-float32``, ``ov-int8``): the
main venv's side. OpenVINO and optimum-intel pin their own ``transformers``, so they live in
a venv of their own, and ``bench/openvino_worker.py`` runs there, in processes of its own;
this module writes the Hugging Face folder, has the worker convert it and passes it ids.

The venv (torch first, the local CPU wheel, kept by pinning it again; ``transformers``
4.57.6, the newest that optimum-intel 2.2.0 exports Marian models with; PyPI's
``torchvision``, which optimum-intel requires, is built against CUDA's torch and breaks
``transformers``' imports beside the CPU one, and nothing here uses it):

    python3.11 -m venv .venv-openvino
    .venv-openvino/bin/pip install torch==2.13.0
    .venv-openvino/bin/pip install "optimum-intel[openvino]==2.2.0" openvino==2026.4.1 \\
        transformers==4.57.6 torch==2.13.0
    .venv-openvino/bin/pip uninstall -y torchvision

A translation run's folder (:func:`marian_folder`, ``RUN/openvino/marian``): the product's
``transformerkit export --format huggingface`` where it accepts the run; a run it refuses
for its position table or its tokenizer only (the recipe's: ``positional: sinusoidal``,
sines and cosines interleaved, where ``MarianMTModel`` has all sines, then all cosines;
``data.tokenizer: bpe``, not SentencePiece) is written here from the same converter
functions (``export_config``, ``export_weights``, ``export_generation_config``) with the
``d_model`` axis of every tensor reordered so that the interleaved table becomes Marian's
(a reordering of the hidden units: the same function, the same logits), no tokenizer files
(the benchmarks pass ids) and the run's LayerNorm epsilon as ``layer_norm_eps`` in
``config.json``, which the worker sets on every ``LayerNorm`` before the export
(``MarianMTModel``'s are PyTorch's 1e-5). The folder and its conversions
(``RUN/openvino/float32``, ``RUN/openvino/int8``) are made once and remade when the run's
``model.keras`` changes (its SHA-256 in ``RUN/openvino/source.json``); their time is not
measured.
"""

import json
import os
import shutil
import sys

import common

from transformerkit.files import file_sha256

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON = os.path.join(ROOT, ".venv-openvino", "bin", "python")
WORKER = os.path.join(HERE, "openvino_worker.py")
VENV_COMMANDS = ("python3.11 -m venv .venv-openvino && .venv-openvino/bin/pip install "
                 "torch==2.13.0 && .venv-openvino/bin/pip install "
                 "'optimum-intel[openvino]==2.2.0' openvino==2026.4.1 transformers==4.57.6 "
                 "torch==2.13.0 && .venv-openvino/bin/pip uninstall -y torchvision")
# the beam's length penalty: transformers' len ** length_penalty, as the CTranslate2 rows'
LENGTH_PENALTY = 0.6


def require_venv():
    """Exit with one line when the OpenVINO venv is missing."""
    if not os.path.isfile(PYTHON):
        raise SystemExit(f"the ov-* systems need the OpenVINO venv {PYTHON}, which is "
                         f"missing; make it in {ROOT} with: {VENV_COMMANDS}")


def worker_env(threads):
    """The OpenVINO worker's environment: this one without this venv's paths, ``threads``
    threads."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return dict(env, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")


def run_worker(mode, spec, threads, timeout=3600):
    """``bench/openvino_worker.py MODE`` in the OpenVINO venv, ``spec`` on its standard
    input, in :func:`worker_env`; the JSON of its last line, or ``{"error": ...}``
    (:func:`common.run_worker`)."""
    require_venv()
    return common.run_worker(WORKER, [mode], timeout=timeout, python=PYTHON,
                             stdin=json.dumps(spec), env=worker_env(threads))


def fresh_folder(base, source_file):
    """``base`` emptied unless it was made from ``source_file`` as it is now."""
    stamp = os.path.join(base, "source.json")
    record = {"file": os.path.abspath(source_file), "sha256": file_sha256(source_file)}
    if os.path.isfile(stamp):
        with open(stamp, encoding="utf-8") as f:
            if json.load(f) == record:
                return
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    with open(stamp, "w", encoding="utf-8") as f:
        json.dump(record, f)


def hidden_order(model):
    """The order of the ``d_model`` units in which the model's position table is Marian's
    (all sines, then all cosines): the identity for ``sinusoidal_split``, the even units
    then the odd ones for ``sinusoidal``; checked against the model's own tables."""
    import numpy as np

    from transformerkit.converters.hf_io import float32_array
    from transformerkit.layers.embeddings import sinusoidal_table

    d = model.d_model
    if model.positional == "sinusoidal_split":
        order = np.arange(d)
    elif model.positional == "sinusoidal":
        order = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
    else:
        raise ValueError(f"model.positional={model.positional!r} has no MarianMTModel "
                         "equivalent")
    expected = sinusoidal_table(model.max_length, d, "sinusoidal_split")
    for layer in (model.source_positions, model.target_positions):
        deviation = float(np.max(np.abs(float32_array(layer.table)[:, order] - expected)))
        if deviation > 1e-5:
            raise ValueError(f"model.{layer.name}: the position table is not the sinusoid "
                             f"(max |diff| {deviation:.3g})")
    return order


def reorder_hidden(tensors, order):
    """``{name: array}`` of a ``MarianMTModel`` with the ``d_model`` axis of each tensor
    taken in ``order``: embeddings' and ``lm_head``'s columns, the inputs of the query, key,
    value and ``fc1`` projections, the outputs (and biases) of ``out_proj`` and ``fc2``,
    LayerNorms' weights and biases."""
    out = {}
    for name, value in tensors.items():
        part = name.rsplit(".", 2)[-2:] if "." in name else [name]
        if name == "final_logits_bias" or (part[-1] == "bias" and part[0] in (
                "q_proj", "k_proj", "v_proj", "fc1")):
            out[name] = value
        elif part[0] in ("shared", "embed_tokens", "lm_head", "q_proj", "k_proj", "v_proj",
                         "fc1") and part[-1] == "weight":
            out[name] = value[:, order]
        elif part[0] in ("out_proj", "fc2") and part[-1] == "weight":
            out[name] = value[order, :]
        elif part[0] in ("out_proj", "fc2") or part[0].endswith("layer_norm"):
            out[name] = value[order]
        else:
            raise ValueError(f"{name}: no rule for its d_model axis")
        out[name] = out[name].copy()
    return out


def write_marian(run, out):
    """The bench's ``MarianMTModel`` folder of ``run`` (see the module docstring)."""
    from transformerkit.converters import marian
    from transformerkit.converters.hf_io import json_bytes, safetensors_bytes, write_folder
    from transformerkit.converters.marian_checks import EXPORTED_ACTIVATIONS

    model = run.model
    head = model.d_model // model.num_heads
    for option, wanted in (("norm_position", "post"), ("max_timescale", 1.0e4),
                           ("use_bias", True), ("key_dim", head), ("value_dim", head)):
        if getattr(model, option) != wanted:
            raise ValueError(f"model.{option}={getattr(model, option)!r}: no MarianMTModel "
                             f"equivalent (needs {wanted!r})")
    if model.activation not in EXPORTED_ACTIVATIONS:
        raise ValueError(f"model.activation={model.activation!r}: no MarianMTModel "
                         "equivalent")
    config = marian.export_config(model)
    config["layer_norm_eps"] = float(model.layer_norm_epsilon or 1e-6)
    tensors = reorder_hidden(marian.export_weights(model), hidden_order(model))
    files = {"config.json": json_bytes(config),
             "generation_config.json": json_bytes(marian.export_generation_config(model)),
             "model.safetensors": safetensors_bytes(tensors)}
    return write_folder(out, files, force=True)


def marian_folder(run):
    """``RUN/openvino/marian``: the run's ``MarianMTModel`` folder, written if missing or
    stale; returns ``(folder, how)``, ``how`` naming which export made it."""
    from transformerkit.export.huggingface import export_run

    base = os.path.join(os.fspath(run.run_dir), "openvino")
    fresh_folder(base, os.path.join(os.fspath(run.run_dir), "model.keras"))
    folder = os.path.join(base, "marian")
    how_file = os.path.join(base, "export.txt")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        try:
            export_run(run, folder, force=True)
            how = "transformerkit export --format huggingface"
        except ValueError as refused:
            write_marian(run, folder)
            how = (f"bench/openvino_peer.py's writer (the product's export refused the run: "
                   f"{refused})")
        with open(how_file, "w", encoding="utf-8") as f:
            f.write(how)
    with open(how_file, encoding="utf-8") as f:
        return folder, f.read()


def converted(folder, base, weights, task, threads):
    """``base/WEIGHTS``: ``folder`` as OpenVINO IR (``weights`` float32, or int8: the
    float32 IR's weights compressed), converted by the worker if missing."""
    out = os.path.join(base, weights)
    if not os.path.isfile(os.path.join(out, "config.json")):
        source = folder if weights == "float32" else converted(folder, base, "float32",
                                                               task, threads)
        shutil.rmtree(out, ignore_errors=True)
        print(f"... converting {source} to OpenVINO ({weights})", flush=True)
        found = run_worker("convert", dict(folder=source, out=out, weights=weights,
                                           task=task), threads)
        if "error" in found:
            shutil.rmtree(out, ignore_errors=True)
            raise RuntimeError(f"the OpenVINO conversion failed: {found['error']}")
    return out


def translation_model(run_dir, system, threads):
    """``(ir folder, ids, how)`` of ``system`` (``ov-float32`` / ``ov-int8``) for a
    translation run: the IR, the run's :class:`MarianIds` and how the folder was made."""
    import transformerkit
    from transformerkit.converters.marian_ids import export_ids

    run = transformerkit.load(run_dir)
    folder, how = marian_folder(run)
    ir = converted(folder, os.path.dirname(folder), system.split("-", 1)[1],
                   "text2text-generation-with-past", threads)
    return ir, export_ids(run.model), how


def translate(system, ir, ids, workloads, threads):
    """Decode ``workloads`` (``[{search, tokens, forced, batches}]``, ``batches`` of our
    padded id arrays) with the IR in the worker; returns the worker's answer with the
    outputs in our ids, or ``{"error": ...}``."""
    import numpy as np

    pad, eos = int(ids.to_marian(0, "source")), int(ids.to_marian(2, "target"))
    sent = [dict(w, batches=[ids.to_marian(np.asarray(b), "source").tolist()
                             for b in w["batches"]]) for w in workloads]
    found = run_worker("seq2seq", dict(system=system, model=ir, threads=threads, pad_id=pad,
                                       eos_id=eos, length_penalty=LENGTH_PENALTY,
                                       workloads=sent), threads)
    if "error" in found:
        return found
    rows = ids.rows_for_marian("target")
    for result in found["results"]:
        result["outputs"] = [[rows[np.asarray(row, dtype="int64")].tolist() for row in batch]
                             for batch in result["outputs"]]
    return found


if __name__ == "__main__":
    sys.exit("bench/openvino_peer.py is a module of the benchmarks (see its docstring)")
