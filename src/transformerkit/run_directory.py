"""The layout of a run directory, the one place that names its files.

``transformerkit train`` writes, and ``transformerkit.load``, the CLI and the benchmarks
read::

    RUN_DIR/
      config.yaml                  the resolved config
      tokenizer.json               one shared vocabulary (and every GPT), or else
      source_tokenizer.json        the source and
      target_tokenizer.json        the target vocabulary; a SentencePiece vocabulary is
                                   tokenizer.model (source_/target_tokenizer.model) instead
      labels.json                  an Encoder classifier's class names, by class id
      model.keras                  the final model
      checkpoints/
        epoch-NNNN.keras           after epoch NNNN, and (``train.checkpoint_every``)
        epoch-NNNN-batch-BBBBBBB.keras  after BBBBBBB batches of epoch NNNN + 1: the last
                                   ``train.checkpoints_to_keep`` of them
        best.keras                 the lowest monitored loss
        latest.json                the state naming the newest complete checkpoint
      history.csv                  per-epoch metrics (Keras ``CSVLogger``)
      logs/                        TensorBoard logs
      averaged.keras               the average of the last checkpoints (``average``)
      metrics.json                 final metrics, and ``evaluate.NAME`` from ``evaluate``
      samples.txt                  translations or GPT samples at the end of training
      history.png                  written by ``transformerkit plot``

Paths only, and ``metrics.json`` (a plain JSON object, written atomically): pure Python,
no Keras.
"""

import json
import os
import re

from transformerkit.files import atomic_write_text

CONFIG = "config.yaml"
SHARED_TOKENIZER = "tokenizer.json"
SOURCE_TOKENIZER = "source_tokenizer.json"
TARGET_TOKENIZER = "target_tokenizer.json"
SENTENCEPIECE_SUFFIX = ".model"  # tokenizer.model ...: a SentencePiece model file
TOKENIZER_SUFFIXES = (".json", SENTENCEPIECE_SUFFIX)
MODEL = "model.keras"
CHECKPOINTS = "checkpoints"
HISTORY = "history.csv"
LOGS = "logs"
METRICS = "metrics.json"
SAMPLES = "samples.txt"
HISTORY_PLOT = "history.png"
AVERAGED = "averaged.keras"
LABELS = "labels.json"

BEST_CHECKPOINT = "best.keras"
CHECKPOINT_STATE = "latest.json"
_EPOCH_CHECKPOINT = re.compile(r"^epoch-(\d+)(?:-batch-(\d+))?\.keras$")


class _Folder:
    """A folder of known files, usable wherever a path is (``os.fspath``, ``str``)."""

    def __init__(self, path):
        self.path = os.fspath(path)

    def __fspath__(self):
        return self.path

    def __str__(self):
        return self.path

    def __repr__(self):
        return f"{type(self).__name__}({self.path!r})"


class CheckpointDirectory(_Folder):
    """The ``checkpoints/`` folder of a run: epoch files, ``best.keras``, ``latest.json``."""

    @property
    def best(self):
        return os.path.join(self.path, BEST_CHECKPOINT)

    @property
    def state(self):
        return os.path.join(self.path, CHECKPOINT_STATE)

    def file(self, name):
        """Path of the checkpoint file ``name`` (e.g. an :meth:`epoch_name`)."""
        return os.path.join(self.path, name)

    @staticmethod
    def epoch_name(epoch):
        """File name of the checkpoint after epoch ``epoch`` (counted from 1)."""
        return f"epoch-{int(epoch):04d}.keras"

    @staticmethod
    def position_name(epoch, batch):
        """File name of a checkpoint inside an epoch: after ``epoch`` complete epochs and
        ``batch`` batches of the next one (``batch`` 0: the same as :meth:`epoch_name`)."""
        if int(batch) == 0:
            return CheckpointDirectory.epoch_name(epoch)
        return f"epoch-{int(epoch):04d}-batch-{int(batch):07d}.keras"

    @staticmethod
    def epoch_of(name):
        """The complete epochs of an :meth:`epoch_name` or :meth:`position_name`, or None for
        any other name."""
        match = _EPOCH_CHECKPOINT.match(name)
        return int(match.group(1)) if match else None

    @staticmethod
    def batch_of(name):
        """The batches into the next epoch of a :meth:`position_name` (0 for an
        :meth:`epoch_name`), or None for any other name."""
        match = _EPOCH_CHECKPOINT.match(name)
        return int(match.group(2) or 0) if match else None

    def epoch_names(self):
        """Names of the checkpoints in the folder (epoch ends and positions inside an epoch),
        oldest first, i.e. ordered by (epoch, batch) ([] if none)."""
        if not os.path.isdir(self.path):
            return []
        names = [f for f in os.listdir(self.path) if _EPOCH_CHECKPOINT.match(f)]
        return sorted(names, key=lambda n: (self.epoch_of(n), self.batch_of(n)))

    def has_checkpoint(self):
        """Whether the folder holds a state file or an epoch checkpoint."""
        return os.path.exists(self.state) or bool(self.epoch_names())


class RunDirectory(_Folder):
    """The files of the run directory at ``path`` (which need not exist yet).

    Example:
    >>> run = RunDirectory("runs/small")
    >>> run.model, run.checkpoints.best
    ('runs/small/model.keras', 'runs/small/checkpoints/best.keras')
    """

    def _file(self, name):
        return os.path.join(self.path, name)

    @property
    def config(self):
        return self._file(CONFIG)

    @property
    def shared_tokenizer(self):
        return self._file(SHARED_TOKENIZER)

    @property
    def model(self):
        return self._file(MODEL)

    @property
    def checkpoints(self):
        return CheckpointDirectory(self._file(CHECKPOINTS))

    @property
    def history(self):
        return self._file(HISTORY)

    @property
    def logs(self):
        return self._file(LOGS)

    @property
    def metrics(self):
        return self._file(METRICS)

    @property
    def samples(self):
        return self._file(SAMPLES)

    @property
    def history_plot(self):
        return self._file(HISTORY_PLOT)

    def tokenizer_paths(self, shared=None, suffix=None):
        """``(source, target)`` tokenizer paths; the same path twice for a shared vocabulary.

        ``shared=None`` reads it from the directory: a run with ``tokenizer.json`` (or
        ``tokenizer.model``) shares one vocabulary (a GPT always does). ``suffix``:
        ``".json"`` or ``".model"`` (a SentencePiece model file); None reads it from the
        directory too (``.model`` where such a tokenizer file exists, else ``.json``).
        """
        if suffix is None:
            suffix = SENTENCEPIECE_SUFFIX if any(
                os.path.exists(self._tokenizer_file(name, SENTENCEPIECE_SUFFIX))
                for name in (SHARED_TOKENIZER, SOURCE_TOKENIZER)) else ".json"
        if suffix not in TOKENIZER_SUFFIXES:
            raise ValueError(f"suffix must be one of {TOKENIZER_SUFFIXES}, got {suffix!r}")
        shared_path = self._tokenizer_file(SHARED_TOKENIZER, suffix)
        if shared is None:
            shared = os.path.exists(shared_path)
        if shared:
            return shared_path, shared_path
        return (self._tokenizer_file(SOURCE_TOKENIZER, suffix),
                self._tokenizer_file(TARGET_TOKENIZER, suffix))

    def _tokenizer_file(self, name, suffix):
        return self._file(os.path.splitext(name)[0] + suffix)

    def remove_other_tokenizers(self, keep):
        """Delete the tokenizer files of the directory not in ``keep`` (left by an earlier
        attempt with other settings), so that :meth:`tokenizer_paths` finds the new ones."""
        keep = {os.path.abspath(p) for p in keep}
        for name in (SHARED_TOKENIZER, SOURCE_TOKENIZER, TARGET_TOKENIZER):
            for suffix in TOKENIZER_SUFFIXES:
                path = self._tokenizer_file(name, suffix)
                if os.path.abspath(path) not in keep and os.path.exists(path):
                    os.remove(path)

    @property
    def averaged(self):
        return self._file(AVERAGED)

    @property
    def labels(self):
        return self._file(LABELS)

    def read_labels(self):
        """A classifier run's class names, index = class id (``labels.json``, a JSON list
        of strings); ``FileNotFoundError`` / ``ValueError`` for a missing or corrupt file."""
        try:
            with open(self.labels, encoding="utf-8") as f:
                labels = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path} has no {LABELS}: not a classifier run, or "
                                    "its training stopped before the data was read") from None
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"{self.labels} is corrupt: {err}") from err
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise ValueError(f"{self.labels} must be a JSON list of class names")
        return labels

    def write_labels(self, labels):
        """Write the class names (index = class id) atomically."""
        atomic_write_text(self.labels, json.dumps(list(labels), ensure_ascii=False, indent=1))

    def model_file(self, checkpoint="model"):
        """The ``.keras`` file to load: ``"model"`` (the final model), ``"best"`` (the best
        checkpoint by ``train.early_stopping_metric``, lowest validation loss by default),
        ``"averaged"`` (written by ``transformerkit average`` or ``train.average_last``), the
        name of a file in ``checkpoints/`` (``epoch-0003.keras``) or any other value as a
        path of its own."""
        if checkpoint == "model":
            return self.model
        if checkpoint == "best":
            return self.checkpoints.best
        if checkpoint == "averaged":
            return self.averaged
        name = os.fspath(checkpoint)
        if os.sep not in name and not os.path.exists(name) and \
                os.path.exists(self.checkpoints.file(name)):
            return self.checkpoints.file(name)
        return name

    def read_metrics(self):
        """``metrics.json`` as a dict; ``FileNotFoundError`` if the run has none yet."""
        with open(self.metrics, encoding="utf-8") as f:
            return json.load(f)

    def write_metrics(self, metrics):
        """Replace ``metrics.json`` with ``metrics`` (a JSON-able dict), atomically."""
        atomic_write_text(self.metrics, json.dumps(metrics, indent=2))
