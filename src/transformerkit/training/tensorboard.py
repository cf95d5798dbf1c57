"""TensorBoard logs on every backend, without TensorFlow: :class:`TensorBoardScalars`.

``keras.callbacks.TensorBoard`` writes through ``tf.summary`` and so needs TensorFlow, which
the ``[torch]`` and ``[jax]`` installs do not have. This callback writes the per-epoch scalars
itself with the ``tensorboard`` package's own record writer
(``tensorboard.summary.writer.record_writer``) and its event protos: no TensorFlow, no
PyTorch, no writer thread. ``transformerkit train`` always uses it, also where TensorFlow is
installed: one code path and the same run directory on every backend. (The ``tensorboard``
package's higher-level writers, ``tensorboard.summary.Writer`` and the ``EventFileWriter``
that ``torch.utils.tensorboard`` wraps, import all of TensorFlow when it is installed: seconds
of start-up.)

The layout is Keras' own, so TensorBoard overlays the training and validation curves::

    RUN/logs/train/events.out.tfevents.*        epoch_loss, epoch_masked_accuracy,
                                                epoch_learning_rate, ...
    RUN/logs/validation/events.out.tfevents.*   epoch_loss, epoch_masked_accuracy,
                                                epoch_bleu, epoch_chrf, ... (``val_`` dropped)

One scalar per finite epoch log entry (``epoch_seconds`` too), at step = epoch (0-based,
continued by ``--resume``, which opens new event files beside the old ones). Each epoch's
events are flushed at the epoch's end, the files closed on train end. The callback writes
nothing outside ``logs/``, and an event file is append-only: a crash loses at most the
epoch in flight, and TensorBoard reads the complete records before a torn one.
"""

import math
import os
import socket
import time

import keras

TRAIN, VALIDATION = "train", "validation"
_counter = 0  # event files one process opens within the same second get distinct names


class TensorBoardScalars(keras.callbacks.Callback):
    """Write the epoch logs (and the optimizer's learning rate) as TensorBoard scalars under
    ``log_dir/train`` and ``log_dir/validation``.

    ``logs`` entries that are not finite numbers are skipped, NaN and inf included (they
    are still in ``history.csv``).
    """

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = os.fspath(log_dir)
        self._writers = {}

    def on_train_begin(self, logs=None):
        self._close()  # a second ``fit`` with the same callback starts new files

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        train = {k: v for k, v in logs.items() if not k.startswith("val_")}
        rate = self._learning_rate()
        if rate is not None:
            train.setdefault("learning_rate", rate)
        validation = {k[len("val_"):]: v for k, v in logs.items() if k.startswith("val_")}
        for name, values in ((TRAIN, train), (VALIDATION, validation)):
            scalars = {_tag(k): v for k, v in values.items() if _finite(v)}
            if scalars:
                self._write(name, epoch, scalars)
        for writer in self._writers.values():
            writer.flush()

    def on_train_end(self, logs=None):
        self._close()

    def _learning_rate(self):
        optimizer = getattr(self.model, "optimizer", None)
        optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            return None
        try:  # a schedule's value at the optimizer's current iteration
            return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        except (TypeError, ValueError):
            return None

    def _write(self, name, epoch, scalars):
        from tensorboard.compat.proto import event_pb2, summary_pb2

        summary = summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
            for tag, value in scalars.items()])
        self._writer(name).write(event_pb2.Event(
            wall_time=time.time(), step=int(epoch), summary=summary).SerializeToString())

    def _writer(self, name):
        if name not in self._writers:
            self._writers[name] = _open_event_file(os.path.join(self.log_dir, name))
        return self._writers[name]

    def _close(self):
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.close()


def _tag(name):
    """Keras' tag: ``epoch_`` + the log's name (``epoch_seconds`` stays as it is)."""
    return name if name.startswith("epoch_") else f"epoch_{name}"


def _finite(value):
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _open_event_file(directory):
    """A new event file in ``directory`` (TensorBoard's naming), its header record written:
    a ``RecordWriter`` over a plain binary file."""
    global _counter
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    os.makedirs(directory, exist_ok=True)
    _counter += 1
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
    path = os.path.join(directory, f"{name}.{_counter}")
    writer = RecordWriter(open(path, "xb"))  # closed by the callback
    writer.write(event_pb2.Event(wall_time=time.time(),
                                 file_version="brain.Event:2").SerializeToString())
    writer.flush()
    return writer
