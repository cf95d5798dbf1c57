"""An OPUS-MT-sized Marian model imported into transformerkit, against ``transformers`` and
CTranslate2 on the same weights: decoding (greedy and beam 4, to EOS) and a fine-tuning step.

The model: a random ``MarianMTModel`` of OPUS-MT's size (6+6 layers, d_model 512, 8 heads,
d_ff 2048, swish, scaled embeddings, one shared vocabulary of 58,101 ids, dropout 0.1),
seeded and written with ``save_pretrained``, with a real Marian vocabulary: a SentencePiece
model (the ``sentencepiece`` package, 8,000 pieces) trained on Multi30k German and English
training text as ``source.spm`` = ``target.spm``, and a ``vocab.json`` in Marian's layout
(``</s>`` 0, ``<unk>`` 1, the pieces, unused filler pieces up to 58,100, ``<pad>`` last).
The rows past the SentencePiece pieces are never inputs; they are outputs of a random
model as of any other, so every system does the work of a 58k vocabulary.

Output length. By default every system decodes exactly ``--max-new-tokens`` tokens (32;
``</s>`` forbidden before: ``min_new_tokens`` / ``min_decoding_length``), as
``bench/decode.py``'s forced runs: the same work for all, whatever the weights. Decoding to
EOS (``--to-eos``) is measured too, but a random model of this size says little there: the
setup raises ``</s>``'s entry of ``final_logits_bias`` by the amount that makes the mean
greedy output length of the first 64 sentences closest to their mean source length
(:func:`calibrate_eos_bias`, exact for greedy search: one search with ``</s>`` suppressed
gives each step's margin), but the random model is degenerate: each greedy output is
either empty (``</s>`` first) or one token repeated to the cap (measured: 75% and 25% at
a cap of 64), and beam search with length penalty 0 then prefers the empty output for
every sentence. The pad's bias entry is -100 (no system picks it).

Inputs: the first ``--sentences`` German sentences of Multi30k test2016, encoded with the
folder's vocabulary (``MarianTokenizer``; ids, so tokenization is outside the timings),
sorted by length and cut into batches of ``--batch`` sentences (64: ``translate``'s default),
the same batches for every system:

- transformerkit: the folder imported as a run (``transformerkit import``, once) and
  loaded with ``transformerkit.load``; the sources encoded by the run's tokenizer, each
  batch through ``greedy_translate`` / ``beam_translate`` with the options ``translate``
  passes (``SearchOptions``: ``alpha`` 0, ``stopping`` early, no ``max_len_a``/
  ``max_len_b`` cap, ``max_new_tokens`` the cap); outputs mapped to Marian's ids
  (``MarianIds``);
- ``transformers``: ``MarianMTModel.generate`` under ``torch.no_grad()`` (``num_beams``,
  ``length_penalty=0``, ``early_stopping=True``, ``forced_eos_token_id=None``, the cap as
  ``max_new_tokens``);
- CTranslate2 4.x float32 and int8: the folder converted by CTranslate2's own
  ``TransformersConverter`` (int8 quantized on load, ``compute_type``), ``beam_size``,
  ``length_penalty=0``, ``max_decoding_length`` the cap, ``intra_threads`` = ``--threads``.

Length penalty 0 everywhere: transformerkit's GNMT penalty ``((5+n)/6)^alpha`` and
``transformers``' ``n^length_penalty`` differ by definition, so only without one can the
outputs be compared token for token. Output agreement: the share of sentences whose
output ids equal ``transformers``' and CTranslate2 float32's.

Fine-tuning step: the imported run's model compiled with Adam (lr 1e-4, betas 0.9/0.98, eps
1e-9) and label-smoothed (0.1) masked cross-entropy, trained with ``train_on_batch``
(transformerkit's PyTorch ``TrainStep``), against ``MarianMTModel`` loaded from the same
folder, trained eagerly with ``torch.optim.Adam`` (same settings) and
``CrossEntropyLoss(label_smoothing=0.1)`` ignoring the pad, on the same length-bucketed
Multi30k de->en batches of about ``--train-tokens`` target tokens; both in dropout's training
mode (0.1) and both with transformerkit's ``malloc`` setting (``keep_freed_memory()``, as
``bench/train_step.py`` gives its peer). Reported: real target tokens per second.

Every system runs in a process of its own (CTranslate2's OpenMP runtime and PyTorch's
compete for the cores inside one process; see ``bench/decode.py``), in ``--repeats``
rounds; each round runs every system once, one after the other, every other round in the
reverse order; each configuration keeps its best round (decoding) or its median
(training). Everything uses ``--threads`` threads (default: all cores). On a machine whose
cores other programs keep busy, use ``--threads 1``: there CTranslate2 with 2 threads ran
6-20x slower than with 1 (one batch of 16 sentences, 8 tokens: 6.0-19.8 s against
1.0-1.3 s; its OpenMP threads wait for each other), and PyTorch's pool suffers likewise.

    python bench/pretrained.py            # -> bench/results/pretrained.FAMILY.{json,md}
    python bench/pretrained.py --sentences 128 --repeats 1 --name pretrained_small
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.abspath(__file__)

# OPUS-MT's shape (Helsinki-NLP/opus-mt-de-en: vocab_size 58101) and a tiny one for the test
SIZES = {
    "opus-mt": dict(layers=6, d_model=512, heads=8, d_ff=2048, vocab=58101, pieces=8000,
                    spm_lines=29000),
    "tiny": dict(layers=1, d_model=32, heads=4, d_ff=64, vocab=600, pieces=300,
                 spm_lines=400),
}
SEARCHES = {"greedy": 1, "beam4": 4}
DECODERS = ("transformerkit", "hf", "ct2-float32", "ct2-int8")
TRAINERS = ("transformerkit-train", "hf-train")
LABELS = {"transformerkit": "transformerkit", "hf": "transformers generate",
          "ct2-float32": "CTranslate2 float32", "ct2-int8": "CTranslate2 int8",
          "transformerkit-train": "transformerkit (train_on_batch)",
          "hf-train": "transformers MarianMTModel + torch.optim.Adam"}
OPTIMIZER = dict(learning_rate=1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
LABEL_SMOOTHING = 0.1


# -- setup: the folder, its vocabulary, the inputs ------------------------------------------
def _lines(split, language, count=None):
    path = os.path.join(common.data_dir(), "multi30k", f"{split}.{language}")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[:count] if count else lines


def _write_vocabulary(folder, spec):
    """``source.spm`` = ``target.spm`` (SentencePiece trained on Multi30k de+en) and a
    Marian-layout ``vocab.json`` of exactly ``spec["vocab"]`` ids."""
    import sentencepiece

    half = spec["spm_lines"] // 2
    lines = _lines("train", "de", half) + _lines("train", "en", half)
    prefix = os.path.join(folder, "spm")
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=prefix, vocab_size=spec["pieces"],
        model_type="unigram", bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1, minloglevel=2)
    os.replace(prefix + ".model", os.path.join(folder, "source.spm"))
    with open(os.path.join(folder, "source.spm"), "rb") as f:
        proto = f.read()
    with open(os.path.join(folder, "target.spm"), "wb") as f:
        f.write(proto)
    with open(prefix + ".vocab", encoding="utf-8") as f:
        pieces = [line.split("\t")[0] for line in f.read().splitlines()]
    os.remove(prefix + ".vocab")
    tokens = ["</s>", "<unk>", *[p for p in pieces if p != "<unk>"]]
    tokens += [f"<unused{i}>" for i in range(spec["vocab"] - 1 - len(tokens))]
    tokens.append("<pad>")
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({t: i for i, t in enumerate(tokens)}, f, ensure_ascii=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "MarianTokenizer", "model_max_length": 512,
                   "separate_vocabs": False}, f)
    return tokens


def _marian_config(spec):
    from transformers import MarianConfig

    pad = spec["vocab"] - 1
    return MarianConfig(
        vocab_size=spec["vocab"], decoder_vocab_size=spec["vocab"], d_model=spec["d_model"],
        encoder_layers=spec["layers"], decoder_layers=spec["layers"],
        encoder_attention_heads=spec["heads"], decoder_attention_heads=spec["heads"],
        encoder_ffn_dim=spec["d_ff"], decoder_ffn_dim=spec["d_ff"],
        activation_function="swish", dropout=0.1, attention_dropout=0.0,
        activation_dropout=0.0, max_position_embeddings=512, scale_embedding=True,
        pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
        forced_eos_token_id=None, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True)


def _eos_gaps(model, batches, pad, cap):
    """Greedy search with ``</s>`` suppressed: per sentence and step, how far ``</s>``'s
    logit stays below the best other token's. Raising ``</s>``'s bias by ``b`` changes no
    choice until ``</s>`` wins, so a sentence's greedy output with bias ``b`` ends at its
    first step whose gap is below ``b``: one search gives the lengths for every bias."""
    import numpy as np
    import torch

    gaps = []
    for _, ids in batches:
        with torch.no_grad():
            out = model.generate(input_ids=torch.from_numpy(ids),
                                 attention_mask=torch.from_numpy(ids != pad).long(),
                                 max_new_tokens=cap, do_sample=False, num_beams=1,
                                 suppress_tokens=[0], forced_eos_token_id=None,
                                 output_logits=True, return_dict_in_generate=True)
        logits = torch.stack(out.logits, 1)
        eos = logits[..., 0].clone()
        logits[..., 0] = logits[..., pad] = -float("inf")
        gaps.append((logits.max(-1).values - eos).numpy())
    return np.concatenate(gaps)


def _greedy_lengths(gaps, bias):
    import numpy as np

    ends = gaps < bias
    return np.where(ends.any(1), ends.argmax(1), gaps.shape[1])


def calibrate_eos_bias(gaps, target_length):
    """The ``</s>`` bias (between two observed gaps, never on one: no ties) whose greedy
    outputs have the mean length closest to ``target_length``."""
    import numpy as np

    values = np.unique(gaps)
    candidates = [values[0] - 1.0, *((values[:-1] + values[1:]) / 2)]
    step = max(1, len(candidates) // 2000)
    best = min(candidates[::step], key=lambda b: abs(
        float(_greedy_lengths(gaps, b).mean()) - target_length))
    return float(best)


def build(args):
    """The Marian folder, its CTranslate2 conversion and the encoded inputs, built once per
    size (cached under ``results/tmp/``); returns the folder's path."""
    spec = SIZES[args.size]
    folder = os.path.join(common.RESULTS, "tmp", f"pretrained-{args.size}")
    done = os.path.join(folder, "setup.json")
    if os.path.exists(done):
        _import_run(folder)
        return folder
    import numpy as np
    import torch
    from transformers import MarianMTModel

    from transformerkit.data.marian_vocab import load_marian_tokenizers

    os.makedirs(folder, exist_ok=True)
    _write_vocabulary(folder, spec)
    source_tok, _ = load_marian_tokenizers(folder)
    torch.manual_seed(0)
    model = MarianMTModel(_marian_config(spec)).eval()
    pad = spec["vocab"] - 1
    sources = _lines("test2016", "de")
    encoded = [source_tok.encode(s, add_eos=True) for s in sources]
    probe = _batches(encoded[:64], 64, pad)
    target_length = float(np.mean([len(e) - 1 for e in encoded[:64]]))
    with torch.no_grad():
        model.final_logits_bias[0, pad] = -100.0  # nobody picks the pad
        gaps = _eos_gaps(model, probe, pad, args.max_new_tokens)
        bias = calibrate_eos_bias(gaps, target_length)
        model.final_logits_bias[0, 0] += bias
    length = float(_greedy_lengths(gaps, bias).mean())
    print(f"    EOS bias {bias:.3f}: mean greedy length {length:.1f} on the probe "
          f"(source {target_length:.1f})", flush=True)
    model.save_pretrained(folder)
    import ctranslate2

    ctranslate2.converters.TransformersConverter(folder).convert(
        os.path.join(folder, "ct2"), force=True)
    train = [source_tok.encode(s, add_eos=True) for s in _lines("train", "de")]
    target = [source_tok.encode(s, add_eos=True) for s in _lines("train", "en")]
    with open(os.path.join(folder, "inputs.json"), "w") as f:
        json.dump({"test": encoded, "train_source": train, "train_target": target}, f)
    setup = {"eos_bias": bias, "probe_mean_greedy_length": round(length, 1),
             "probe_mean_source_length": round(target_length, 1), "size": spec,
             "max_new_tokens": args.max_new_tokens}
    with open(done, "w") as f:
        json.dump(setup, f)
    _import_run(folder)
    return folder


def _import_run(folder):
    """``transformerkit import FOLDER --out FOLDER/run`` (once): the run ours loads."""
    run = os.path.join(folder, "run")
    if not os.path.exists(os.path.join(run, "model.keras")):
        os.environ.setdefault("KERAS_BACKEND", "torch")
        from transformerkit.importing import import_checkpoint

        import_checkpoint(folder, run, force=True)
    return run


def _batches(encoded, batch, pad, order=None):
    """``[(indices, (rows, longest) int64 array padded with pad)]``, sorted by length as
    ``translate`` batches."""
    import numpy as np

    if order is None:
        order = np.argsort([len(e) for e in encoded], kind="stable")
    out = []
    for start in range(0, len(order), batch):
        chunk = [int(i) for i in order[start:start + batch]]
        ids = np.full((len(chunk), max(len(encoded[i]) for i in chunk)), pad, dtype="int64")
        for row, i in enumerate(chunk):
            ids[row, :len(encoded[i])] = encoded[i]
        out.append((chunk, ids))
    return out


def _cut_hf(rows, pad, eos=0):
    """``generate``'s output rows -> ids after the decoder start, up to EOS, no padding."""
    out = []
    for row in rows:
        ids = []
        for token in row[1:]:
            if token == eos:
                break
            if token != pad:
                ids.append(int(token))
        out.append(ids)
    return out


def _inputs(folder, sentences, batch):
    """The first ``sentences`` test sentences in Marian ids, batched; and the pad id."""
    with open(os.path.join(folder, "inputs.json")) as f:
        encoded = json.load(f)["test"][:sentences]
    pad = _setup(folder)["size"]["vocab"] - 1
    return _batches(encoded, batch, pad), pad


def _setup(folder):
    with open(os.path.join(folder, "setup.json")) as f:
        return json.load(f)


# -- decoders: Marian ids in, Marian ids out (up to EOS) -------------------------------------
def transformerkit_decoder(folder, search, cap, batch, sentences, least=0):
    """The imported run as ``transformerkit.load`` gives it; each batch through the decoding
    function ``translate`` calls, with the options it passes (``SearchOptions``). The
    sources are the run's own tokenizer's ids (checked equal to the Marian ids mapped by
    ``MarianIds``, so every system reads the same sentences)."""
    import numpy as np

    import transformerkit
    from transformerkit.converters.marian_ids import MarianIds
    from transformerkit.decoding import beam_translate, greedy_translate
    from transformerkit.decoding.options import SearchOptions

    run = transformerkit.load(os.path.join(folder, "run"))
    ids = MarianIds.from_folder(folder)
    options = SearchOptions(beam_size=SEARCHES[search], alpha=0.0, stopping="early",
                            max_new_tokens=cap, max_len_a=None, max_len_b=None,
                            batch_size=batch)
    texts = _lines("test2016", "de", sentences)
    encoded = [run.source_tokenizer.encode(t, add_eos=True) for t in texts]
    marian, pad = _inputs(folder, sentences, batch)
    ours = {tuple(chunk): ids_ for chunk, ids_ in _batches(encoded, batch, 0)}
    for chunk, theirs in marian:
        if not np.array_equal(ours[tuple(chunk)], ids.to_ours(theirs, "source")):
            raise SystemExit("the run's tokenizer and the Marian ids disagree")

    def decode(marian_batch, chunk):
        source = ours[tuple(chunk)].astype("int32")
        if options.searches_beams:
            found = [hyps[0].ids for hyps in beam_translate(run.model, source, options,
                                                            min_new_tokens=least)]
        else:
            found = greedy_translate(run.model, source, options, min_new_tokens=least)
        return [ids.to_marian(row).tolist() for row in found]

    return decode


def hf_decoder(folder, search, cap, pad, least=0):
    import torch
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(folder).eval()
    beams = SEARCHES[search]
    extra = dict(length_penalty=0.0, early_stopping=True) if beams > 1 else {}

    def decode(marian):
        with torch.no_grad():
            out = model.generate(input_ids=torch.from_numpy(marian),
                                 attention_mask=torch.from_numpy(marian != pad).long(),
                                 max_new_tokens=cap, min_new_tokens=least,
                                 num_beams=beams, do_sample=False,
                                 forced_eos_token_id=None, **extra)
        return _cut_hf(out.numpy(), pad)

    return decode


def ctranslate2_decoder(folder, system, search, cap, pad, threads, least=0):
    """CTranslate2 on its own conversion of the folder; pieces in and out, mapped through
    ``vocab.json`` (the source keeps its ``</s>``, as ``MarianTokenizer`` gives it)."""
    import ctranslate2

    with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    tokens = sorted(vocab, key=vocab.get)
    translator = ctranslate2.Translator(os.path.join(folder, "ct2"), device="cpu",
                                        compute_type=system.split("-")[1],
                                        intra_threads=threads, inter_threads=1)
    options = dict(beam_size=SEARCHES[search], length_penalty=0.0, max_decoding_length=cap,
                   min_decoding_length=least, max_input_length=0)

    def decode(marian):
        source = [[tokens[i] for i in row if i != pad] for row in marian.tolist()]
        found = translator.translate_batch(source, **options)
        return [[vocab[t] for t in r.hypotheses[0]] for r in found]

    return decode


def decode_worker(spec):
    """One system: greedy then beam 4 over all batches (after one untimed batch)."""
    folder, cap, threads = spec["folder"], spec["max_new_tokens"], spec["threads"]
    least = cap if spec.get("forced") else 0
    batches, pad = _inputs(folder, spec["sentences"], spec["batch"])
    results = []
    for search in SEARCHES:
        system = spec["system"]
        if system == "transformerkit":
            decode = transformerkit_decoder(folder, search, cap, spec["batch"],
                                            spec["sentences"], least)
        else:
            decode = (hf_decoder(folder, search, cap, pad, least) if system == "hf" else
                      ctranslate2_decoder(folder, system, search, cap, pad, threads, least))
            decode = _ignoring_chunk(decode)
        decode(*batches[len(batches) // 2][::-1])  # warm-up
        outputs = [None] * sum(len(chunk) for chunk, _ in batches)
        started = time.perf_counter()
        for chunk, ids in batches:
            for i, out in zip(chunk, decode(ids, chunk), strict=True):
                outputs[i] = out
        seconds = time.perf_counter() - started
        results.append(dict(system=system, search=search, seconds=round(seconds, 3),
                            sentences=len(outputs), outputs=outputs))
        print(f"    {system} {search}: {seconds:.2f} s", file=sys.stderr, flush=True)
    return results


def _ignoring_chunk(decode):
    return lambda ids, chunk: decode(ids)


# -- fine-tuning step ------------------------------------------------------------------------
def train_batches(folder, tokens_per_batch, count, longest=64):
    """``count`` batches ``(source, decoder_input, labels)`` in transformerkit's ids (pad 0,
    ``<s>`` 1 first in the decoder input): Multi30k de->en training pairs sorted by target
    length, cut into runs of about ``tokens_per_batch`` target tokens, ``count`` of them
    taken evenly over the lengths."""
    import numpy as np

    from transformerkit.converters.marian_ids import MarianIds

    ids = MarianIds.from_folder(folder)
    with open(os.path.join(folder, "inputs.json")) as f:
        data = json.load(f)
    pairs = [(s, t) for s, t in zip(data["train_source"], data["train_target"], strict=True)
             if len(s) <= longest and len(t) <= longest]
    pairs.sort(key=lambda p: (len(p[1]), len(p[0])))
    runs, start = [], 0
    while start < len(pairs):
        rows = max(1, tokens_per_batch // len(pairs[start][1]))
        run = pairs[start:start + rows]
        rows = max(1, tokens_per_batch // max(len(t) for _, t in run))
        runs.append(pairs[start:start + rows])
        start += rows
    chosen = [runs[int(i)] for i in np.linspace(0, len(runs) - 1, count + 2)[1:-1]]
    out = []
    for run in chosen:
        width_s, width_t = max(len(s) for s, _ in run), max(len(t) for _, t in run)
        source = np.zeros((len(run), width_s), "int32")
        decoder_input = np.zeros((len(run), width_t), "int32")
        labels = np.zeros((len(run), width_t), "int32")
        for row, (s, t) in enumerate(run):
            source[row, :len(s)] = ids.to_ours(s, "source")
            target = ids.to_ours(t, "target")
            labels[row, :len(t)] = target
            decoder_input[row, :len(t)] = [1, *target[:-1]]
        out.append((source, decoder_input, labels))
    return out, ids


def transformerkit_trainer(folder):
    """The imported run's model (``transformerkit.load``), compiled as ``train`` compiles
    it (the package's fused Adam, masked label-smoothed cross-entropy, ``TrainStep``)."""
    import transformerkit
    from transformerkit.training import Adam, MaskedCrossEntropy, attach_train_step

    model = transformerkit.load(os.path.join(folder, "run")).model
    model.compile(optimizer=Adam(**OPTIMIZER),
                  loss=MaskedCrossEntropy(label_smoothing=LABEL_SMOOTHING))
    attach_train_step(model)
    return lambda batch: model.train_on_batch(batch[:2], batch[2])


def hf_trainer(folder, ids, pad):
    import torch
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(folder)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=OPTIMIZER["learning_rate"],
                                 betas=(OPTIMIZER["beta_1"], OPTIMIZER["beta_2"]),
                                 eps=OPTIMIZER["epsilon"])
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=pad, label_smoothing=LABEL_SMOOTHING)

    def step(batch):
        source, decoder_input, labels = (
            torch.from_numpy(ids.to_marian(a, side)) for a, side in
            zip(batch, ("source", "target", "target"), strict=True))
        logits = model(input_ids=source, attention_mask=source != pad,
                       decoder_input_ids=decoder_input).logits
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)

    return step


def train_worker(spec):
    """One system: a pass over the batches untimed (every shape once), then one timed."""
    import numpy as np

    folder = spec["folder"]
    batches, ids = train_batches(folder, spec["train_tokens"], spec["train_batches"])
    pad = _setup(folder)["size"]["vocab"] - 1
    step = (transformerkit_trainer(folder) if spec["system"] == "transformerkit-train"
            else hf_trainer(folder, ids, pad))
    losses = [float(np.asarray(step(b)).ravel()[0]) for b in batches]
    started = time.perf_counter()
    for batch in batches:
        step(batch)
    seconds = time.perf_counter() - started
    tokens = sum(common.real_target_tokens(b) for b in batches)
    print(f"    {spec['system']}: {seconds:.2f} s", file=sys.stderr, flush=True)
    return [dict(system=spec["system"], seconds=round(seconds, 3), target_tokens=tokens,
                 steps=len(batches), first_losses=[round(x, 4) for x in losses])]


def worker(spec):
    import torch

    import transformerkit

    transformerkit.keep_freed_memory()  # the CLI's malloc setting, for every system alike
    torch.set_num_threads(spec["threads"])
    found = train_worker(spec) if spec["system"] in TRAINERS else decode_worker(spec)
    # every worker's results, outputs included, also kept beside the folder (a run cut short
    # still leaves what it measured)
    with open(os.path.join(spec["folder"], "worker-results.jsonl"), "a") as f:
        f.write(json.dumps({"time": time.time(), "results": found}) + "\n")
    return found


# -- orchestration ---------------------------------------------------------------------------
def run_all(args):
    folder = build(args)
    threads = str(args.threads)
    env = {"KERAS_BACKEND": "torch", "OMP_NUM_THREADS": threads}
    systems = list(DECODERS) + ([] if args.no_train else list(TRAINERS))
    runs = {}
    for round_index in range(args.repeats):
        order = systems[::-1] if round_index % 2 else systems
        for system in order:
            spec = dict(system=system, folder=folder, sentences=args.sentences,
                        batch=args.batch, max_new_tokens=args.max_new_tokens,
                        threads=args.threads, forced=not args.to_eos,
                        train_tokens=args.train_tokens,
                        train_batches=args.train_batches)
            print(f"... round {round_index + 1}/{args.repeats}: {system}", flush=True)
            out = common.run_worker(HERE, ["--worker", json.dumps(spec)], env, timeout=7200)
            if isinstance(out, dict):
                print("    failed:", out, flush=True)
                out = [dict(system=system, search=s, **out) for s in
                       (SEARCHES if system in DECODERS else [None])]
            for r in out:
                runs.setdefault((r["system"], r.get("search")), []).append(r)
                print("    ", {k: v for k, v in r.items() if k != "outputs"}, flush=True)
    payload = summarize(args, folder, runs)
    common.write_results(args.name, payload, table(payload))


def summarize(args, folder, runs):
    """Decoding: each configuration's best round, its outputs and their agreement;
    fine-tuning: each system's median round; the goals."""
    decoding, training = [], []
    for (system, search), found in runs.items():
        good = [r for r in found if "error" not in r]
        if not good:
            (decoding if search else training).append(found[0])
            continue
        if search:
            best = min(good, key=lambda r: r["seconds"])
            outputs = best["outputs"]
            lengths = [len(o) for o in outputs]
            tokens = sum(lengths)
            decoding.append(dict(
                system=system, search=search, sentences=best["sentences"],
                seconds=best["seconds"], timings=[r["seconds"] for r in good],
                sentences_per_s=round(best["sentences"] / best["seconds"], 2),
                target_tokens_per_s=round(tokens / best["seconds"], 1),
                mean_output_tokens=round(tokens / len(outputs), 2),
                reached_cap=round(sum(n >= args.max_new_tokens for n in lengths)
                                  / len(outputs), 3), outputs=outputs))
        else:
            ordered = sorted(good, key=lambda r: r["target_tokens"] / r["seconds"])
            median = ordered[(len(ordered) - 1) // 2]
            training.append(dict(
                system=system, steps=median["steps"], target_tokens=median["target_tokens"],
                seconds=median["seconds"],
                target_tokens_per_s=round(median["target_tokens"] / median["seconds"], 1),
                rounds_tokens_per_s=[round(r["target_tokens"] / r["seconds"], 1)
                                     for r in good], first_losses=median["first_losses"]))
    by = {(r["system"], r["search"]): r for r in decoding if "outputs" in r}
    for r in decoding:
        for peer in ("hf", "ct2-float32"):
            other = by.get((peer, r["search"]))
            if "outputs" in r and other:
                same = sum(a == b for a, b in zip(r["outputs"], other["outputs"], strict=True))
                r[f"identical_to_{peer}"] = round(same / len(r["outputs"]), 3)
    goals = _goals(decoding, training)
    for r in decoding:
        r.pop("outputs", None)
    return {"machine": dict(common.machine(), threads=args.threads), "setup": _setup(folder),
            "sentences": args.sentences, "batch": args.batch,
            "max_new_tokens": args.max_new_tokens, "forced": not args.to_eos,
            "repeats": args.repeats,
            "train_tokens": args.train_tokens, "train_batches": args.train_batches,
            "decoding": decoding, "training": training, "goals": goals}


def _rate(rows, system, search=None, key="sentences_per_s"):
    for r in rows:
        if r["system"] == system and r.get("search") == search and key in r:
            return r[key]
    return None


def _goals(decoding, training):
    goals = []
    for search in SEARCHES:
        ours = _rate(decoding, "transformerkit", search)
        for peer, target in (("hf", 1.5), ("ct2-float32", 1.0)):
            theirs = _rate(decoding, peer, search)
            ratio = ours / theirs if ours and theirs else None
            same = next((r.get(f"identical_to_{peer}") for r in decoding
                         if r["system"] == "transformerkit" and r["search"] == search), None)
            goals.append(dict(goal=f"decoding {search} >= {target}x {LABELS[peer]}",
                              ratio=round(ratio, 3) if ratio else None,
                              identical_outputs=same,
                              passed=bool(ratio and ratio >= target)))
    ours = _rate(training, "transformerkit-train", key="target_tokens_per_s")
    theirs = _rate(training, "hf-train", key="target_tokens_per_s")
    if ours and theirs:
        goals.append(dict(goal="fine-tuning step >= 1.2x transformers MarianMTModel "
                               "(same malloc setting)", ratio=round(ours / theirs, 3),
                          passed=ours / theirs >= 1.2))
    return goals


def table(payload):
    decoding, training = payload["decoding"], payload["training"]
    lines = ["| search | system | sentences/s | target tokens/s | mean output tokens | "
             "at the cap | ours vs it | identical to transformers | identical to "
             "CTranslate2 float32 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in decoding:
        if "error" in r:
            lines.append(f"| {r['search']} | {LABELS[r['system']]} | error: {r['error']} "
                         "| | | | | | |")
            continue
        ours = _rate(decoding, "transformerkit", r["search"])
        ratio = f"{ours / r['sentences_per_s']:.2f}x" if ours and r["system"] != \
            "transformerkit" else ""
        same = [f"{100 * r[k]:.0f}%" if k in r and not r["system"] == peer else ""
                for k, peer in (("identical_to_hf", "hf"),
                                ("identical_to_ct2-float32", "ct2-float32"))]
        lines.append(f"| {r['search']} | {LABELS[r['system']]} | {r['sentences_per_s']} | "
                     f"{r['target_tokens_per_s']:,.0f} | {r['mean_output_tokens']} | "
                     f"{100 * r['reached_cap']:.0f}% | {ratio} | {same[0]} | {same[1]} |")
    if training:
        lines += ["", "| fine-tuning step | target tokens/s | rounds | ours vs it |",
                  "|---|---:|---|---:|"]
        ours = _rate(training, "transformerkit-train", key="target_tokens_per_s")
        for r in training:
            if "error" in r:
                lines.append(f"| {LABELS[r['system']]} | error: {r['error']} | | |")
                continue
            ratio = f"{ours / r['target_tokens_per_s']:.2f}x" if ours and \
                r["system"] != "transformerkit-train" else ""
            rounds = ", ".join(f"{x:,.0f}" for x in r["rounds_tokens_per_s"])
            lines.append(f"| {LABELS[r['system']]} | {r['target_tokens_per_s']:,.0f} | "
                         f"{rounds} | {ratio} |")
    setup, size = payload["setup"], payload["setup"]["size"]
    lines.append("")
    lines += [f"- {'PASS' if g['passed'] else 'FAIL'}: {g['goal']}: "
              f"{g['ratio'] if g['ratio'] is not None else 'n/a'}x"
              + (f" ({100 * g['identical_outputs']:.0f}% identical outputs)"
                 if g.get("identical_outputs") is not None else "")
              for g in payload["goals"]]
    lines.append(
        f"\nRandom Marian of {size['layers']}+{size['layers']} layers, d_model "
        f"{size['d_model']}, {size['heads']} heads, d_ff {size['d_ff']}, swish, shared "
        f"vocabulary {size['vocab']:,} (SentencePiece of {size['pieces']:,} pieces on Multi30k); "
        f"`</s>` logit bias +{setup['eos_bias']:.2f} (mean greedy length "
        f"{setup['probe_mean_greedy_length']} vs source {setup['probe_mean_source_length']} "
        f"on the calibration sentences). {payload['sentences']} Multi30k test2016 sentences "
        f"in batches of {payload['batch']}, "
        + (f"exactly {payload['max_new_tokens']} output tokens (EOS forbidden before)"
           if payload.get("forced") else
           f"to EOS, at most {payload['max_new_tokens']} output tokens (EOS included)")
        + ", length penalty 0, early stopping; target tokens exclude "
        f"EOS. Best of {payload['repeats']} rounds per decoding configuration; fine-tuning: "
        f"{payload['train_batches']} batches of ~{payload['train_tokens']} target tokens, "
        "median round, both with transformerkit's malloc setting. "
        f"{payload['machine']['threads']} threads for every system.")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=500,
                        help="Multi30k test2016 sentences decoded (500)")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch (64)")
    parser.add_argument("--max-new-tokens", type=int, default=32,
                        help="output length: exactly this many tokens, or with --to-eos at "
                             "most this many, EOS included (32)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="rounds (one process per system each)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="CPU threads of every system (all cores)")
    parser.add_argument("--train-tokens", type=int, default=2048,
                        help="target tokens per fine-tuning batch (2048)")
    parser.add_argument("--train-batches", type=int, default=3)
    parser.add_argument("--no-train", action="store_true", help="decoding only")
    parser.add_argument("--to-eos", action="store_true",
                        help="decode to EOS (at most --max-new-tokens) instead of exactly "
                             "--max-new-tokens tokens (see the module docstring)")
    parser.add_argument("--size", choices=sorted(SIZES), default="opus-mt",
                        help="opus-mt (the bench) or tiny (a test of the script)")
    parser.add_argument("--name", default="pretrained",
                        help="results/NAME.{json,md} (default pretrained)")
    parser.add_argument("--results", default=common.RESULTS,
                        help="folder of the result files (bench/results)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    common.RESULTS = os.path.abspath(args.results)
    run_all(args)


if __name__ == "__main__":
    main()
