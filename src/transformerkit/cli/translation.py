"""The commands that use a translation or GPT run: ``translate``, ``generate``,
``evaluate``, ``attention``, ``export``, ``serve``."""

import os
import sys

from transformerkit.cli.common import (
    echo,
    evaluation_data,
    load_run,
    options_of,
    stderr_console,
    stdin_chunks,
    valid_text,
)
from transformerkit.cli.encoders import evaluate_classifier
from transformerkit.extras import require
from transformerkit.run_directory import RunDirectory


def translate_command(args):
    from transformerkit.decoding.options import SearchOptions

    run = load_run(args)
    options = options_of(args, SearchOptions, run.search)
    texts = [valid_text(t, f"argument {i + 1}") for i, t in enumerate(args.texts)]
    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    chunks = [texts] if texts else stdin_chunks(stdin, options.batch_size)
    if args.scores and options.n_best > 1:
        raise ValueError("--scores prints one translation per line; --n-best already prints "
                         "each hypothesis with its score")
    offset = 0
    for chunk in chunks:
        _translate_chunk(run, chunk, offset, options, args.scores)
        offset += len(chunk)
    return 0


def _translate_chunk(run, texts, offset, options, scores=False):
    """Translate ``texts`` and print them in order as soon as each is ready; empty lines
    stay empty lines; ``scores``: each line is LOGPROB<TAB>TEXT (``Run.score``)."""
    real = [i for i, t in enumerate(texts) if t.strip()]
    ready, next_out = {}, 0

    def flush():
        nonlocal next_out
        while next_out < len(texts) and (next_out in ready or not texts[next_out].strip()):
            result = ready.pop(next_out, "")
            if options.n_best > 1:
                for text, score in result:
                    echo(f"{offset + next_out}\t{score:.4f}\t{text}")
            else:
                echo(result)
            next_out += 1

    flush()
    if real:
        for indices, results in run.translate_batches([texts[i] for i in real], options):
            if scores:
                logp = run.score([texts[real[i]] for i in indices], results)
                results = [f"{s:.4f}\t{r}" for s, r in zip(logp, results, strict=True)]
            for i, result in zip(indices, results, strict=True):
                ready[real[i]] = result
            flush()
    flush()


def generate_command(args):
    from transformerkit.decoding.options import GenerationOptions

    options_of(args, GenerationOptions)  # the flags checked before the run is loaded
    run = load_run(args)
    options = options_of(args, GenerationOptions, run.generation)  # from the run's own
    echo(run.generate(valid_text(args.prompt, "--prompt"), options))
    return 0


def evaluate_command(args):
    from rich.progress import Progress

    from transformerkit.evaluation import corpus_scores
    from transformerkit.files import atomic_write_text

    run = load_run(args)
    if run.kind == "encoder":
        return evaluate_classifier(args, run)
    if run.kind != "transformer":
        raise ValueError(f"evaluate needs a translation or an encoder classifier run; "
                         f"{args.run_dir} holds a {run.kind}")
    from transformerkit.decoding.options import SearchOptions

    # evaluation searches: one translation per text, never sampled
    options = options_of(args, SearchOptions, run.search.replace(
        n_best=1, temperature=None, top_k=None, top_p=None, seed=None))
    name, sources, references = evaluation_data(args, run)
    if args.max_sentences:
        sources, references = sources[: args.max_sentences], references[: args.max_sentences]
    hypotheses = [None] * len(sources)
    with Progress(transient=True, console=stderr_console()) as progress:
        task = progress.add_task(f"translating {name}", total=len(sources))
        for indices, results in run.translate_batches(sources, options):
            for i, text in zip(indices, results, strict=True):
                hypotheses[i] = text
            progress.advance(task, len(indices))
    scores = corpus_scores(hypotheses, references)
    if args.output:
        atomic_write_text(args.output, "\n".join(hypotheses) + "\n")
    echo(f"{name}: {len(sources)} sentences, beam {options.beam_size}, alpha {options.alpha}, "
           f"engine {run.runtime.engine}")
    echo(f"BLEU = {scores['bleu']:.2f}   {scores['bleu_signature']}")
    echo(f"chrF = {scores['chrf']:.2f}   {scores['chrf_signature']}")
    run_dir = RunDirectory(args.run_dir)
    metrics = run_dir.read_metrics() if os.path.exists(run_dir.metrics) else {}
    metrics.setdefault("evaluate", {})[name] = dict(
        scores, sentences=len(sources), beam_size=options.beam_size, alpha=options.alpha,
        checkpoint=run.runtime.checkpoint, engine=run.runtime.engine)
    run_dir.write_metrics(metrics)
    echo(f"stored in {run_dir.metrics}")
    return 0


def attention_command(args):
    from transformerkit.plotting import plot_attention

    run = load_run(args)
    target = args.target
    if run.kind == "transformer" and target is None:
        target = run.translate(args.source, beam_size=1,
                               max_new_tokens=run.model.max_length - 1)
        echo(f"target (greedy translation): {target}")
    weights = run.attention(args.source, target)
    if run.kind == "gpt":
        kind, queries, keys = "self", weights["tokens"], weights["tokens"]
    else:
        kind = args.kind
        queries = {"cross": weights["target_output_tokens"],
                   "decoder_self": weights["target_output_tokens"],
                   "encoder": weights["source_tokens"]}[kind]
        keys = {"cross": weights["source_tokens"], "decoder_self": weights["target_input_tokens"],
                "encoder": weights["source_tokens"]}[kind]
    layers = weights[kind].shape[0]
    if not -layers <= args.layer < layers:
        raise ValueError(f"--layer {args.layer} does not exist: the model has {layers} layers")
    layer = args.layer % layers
    out = plot_attention(weights[kind][layer], queries, keys, args.out,
                         title=f"{kind} attention, layer {layer}")
    echo(f"wrote {out}")
    return 0


def export_command(args):
    """``export RUN --format ctranslate2``: :func:`transformerkit.export.ctranslate2.export_run`;
    ``--format huggingface``: :func:`transformerkit.export.huggingface.export_run`."""
    if args.format == "huggingface":
        from transformerkit.export.huggingface import export_run

        if args.quantization:
            raise ValueError("--quantization applies to --format ctranslate2 only")
        out = export_run(load_run(args), args.out, force=args.force)
        echo(f"wrote {out}")
        return 0
    from transformerkit.export.ctranslate2 import export_run

    out = export_run(load_run(args), args.out, quantization=args.quantization, force=args.force)
    echo(f"wrote {out}")
    return 0


def serve_command(args):
    import dataclasses

    from transformerkit.decoding.options import RuntimeOptions
    from transformerkit.serving.limits import Limits

    runtime = options_of(args, RuntimeOptions)  # checked before anything starts
    limits = Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)})
    for package in ("fastapi", "uvicorn", "prometheus_client"):
        require(package, "transformerkit serve")
    from transformerkit.serving.server import serve

    return serve(args.run_dirs, runtime, host=args.host, port=args.port, limits=limits,
                 cors_origins=args.cors_origins, api_keys=args.api_keys, no_auth=args.no_auth,
                 workers=args.workers, shutdown_timeout=args.shutdown_timeout)
