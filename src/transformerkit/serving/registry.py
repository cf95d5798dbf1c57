"""The runs a server serves: :class:`RunRegistry`, looked up by name (``"model"`` in a
request; none: the first that serves the route), each with the summary ``GET /models``
shows."""

import contextlib
import json

from transformerkit.decoding.options import RuntimeOptions
from transformerkit.serving.errors import RequestError


def check_engine(engine):
    """``engine`` if the runtime options declare it, their default for None (a clear
    ``ValueError`` otherwise)."""
    return RuntimeOptions().engine if engine is None else RuntimeOptions(engine=engine).engine


def run_summary(name, run, engine):
    """What ``GET /models`` says of one run: kind, size, config summary, metrics."""
    from transformerkit.run_directory import RunDirectory

    metrics = {}
    if run.run_dir is not None:
        with contextlib.suppress(OSError, ValueError):
            with open(RunDirectory(run.run_dir).metrics, encoding="utf-8") as f:
                metrics = json.load(f)
    data = run.config.data
    return {"name": name, "kind": run.kind, "engine": engine,
            "parameters": int(run.count_params()),
            "max_length": int(run.max_length),
            "model": {k: v for k, v in run.config.model.items() if v is not None},
            "data": {k: getattr(data, k) for k in ("dataset", "source_lang", "target_lang",
                                                   "tokenizer", "vocab_size")},
            "metrics": metrics}


class RunRegistry:
    """``runs`` (``{name: transformerkit.api.Run}``, the first the default) and the
    ``engine`` ("keras" or "ctranslate2") their translations and generations run on."""

    def __init__(self, runs, engine=None):
        if not runs:
            raise ValueError("create_app needs at least one run")
        engine = check_engine(engine)
        self.runs = dict(runs)
        self.engine = engine
        self.default = next(iter(self.runs))
        self.summaries = [run_summary(name, run, engine) for name, run in self.runs.items()]

    @property
    def names(self):
        return list(self.runs)

    def pick(self, name, kind, route):
        """``(name, run)`` of the requested model (None: the first run of ``kind``, else the
        default: a server of a translator and a GPT answers ``/generate`` with the GPT); a
        404 for an unknown name, a 422 for a run of another kind than ``kind`` (None takes
        any kind)."""
        if name is None:
            name = next((n for n, run in self.runs.items() if kind in (None, run.kind)),
                        self.default)
        if name not in self.runs:
            raise RequestError(404, f"no model named {name!r}; this server has: "
                                    f"{', '.join(self.runs)} (GET /models)")
        run = self.runs[name]
        if kind is not None and run.kind != kind:
            other = "/generate" if run.kind == "gpt" else "/translate"
            raise RequestError(422, f"model {name!r} is a {run.kind} run; {route} needs a "
                                    f"{kind} run (use {other})")
        return name, run
