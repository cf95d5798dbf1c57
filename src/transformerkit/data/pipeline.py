"""From text pairs to padded batches: encoding, length filter, token-budget bucketing,
teacher forcing, and language-model blocks.

Special-token placement (ids from :mod:`transformerkit.special_tokens`):

- source: ``pieces + [EOS]`` (no BOS: the encoder sees the whole source at once, the EOS
  marks its end as in tensor2tensor / fairseq);
- target: ``[BOS] + pieces + [EOS]``; teacher forcing turns it into decoder input
  ``[BOS] + pieces`` and labels ``pieces + [EOS]`` (paper section 3.1: outputs shifted right).

Batches are right-padded with 0 (PAD) and int32. Their shapes vary from batch to batch,
which ``model.fit`` accepts on every backend for a ``keras.utils.PyDataset``. Pass
``shuffle=False`` to ``model.fit``: these datasets shuffle themselves, deterministically.
"""

import dataclasses

import keras
import numpy as np

from transformerkit.data.padding import pad_batch


@dataclasses.dataclass
class EncodedPairs:
    """Encoded parallel corpus.

    Attributes:
        source: list of int32 arrays ``(source_len,)``: pieces + EOS.
        target: list of int32 arrays ``(target_len,)``: BOS + pieces + EOS.
        dropped: int, pairs removed by the length filter of :func:`encode_pairs`.
    """

    source: list
    target: list
    dropped: int = 0

    def __post_init__(self):
        if len(self.source) != len(self.target):
            raise ValueError(f"source has {len(self.source)} sequences, target "
                             f"{len(self.target)}")

    def __len__(self):
        return len(self.source)


def encode_pairs(sources, targets, source_tokenizer, target_tokenizer, max_length):
    """Tokenize pairs and drop those longer than ``max_length`` tokens on either side.

    Lengths count the special tokens (source + EOS, BOS + target + EOS). Kept pairs keep
    their corpus order; nothing else is removed.

    Returns:
        :class:`EncodedPairs` with ``dropped`` = number of pairs over the limit.
    """
    sources, targets = list(sources), list(targets)
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if int(max_length) < 2:
        raise ValueError(f"max_length must be >= 2 (BOS + EOS), got {max_length}")
    source_ids = source_tokenizer.encode_batch(sources, add_eos=True)
    target_ids = target_tokenizer.encode_batch(targets, add_bos=True, add_eos=True)
    kept_source, kept_target = [], []
    for s, t in zip(source_ids, target_ids, strict=True):
        if len(s) <= max_length and len(t) <= max_length:
            kept_source.append(np.asarray(s, dtype="int32"))
            kept_target.append(np.asarray(t, dtype="int32"))
    return EncodedPairs(kept_source, kept_target, dropped=len(sources) - len(kept_source))


def teacher_forcing(target_batch):
    """Shift a padded target batch for teacher forcing.

    Args:
        target_batch: ``(batch, t)`` ints, rows ``BOS ... EOS 0 0``.

    Returns:
        ``(decoder_input, labels)``, both ``(batch, t - 1)``: ``target[:, :-1]`` and
        ``target[:, 1:]`` (int32 for numpy input).
    """
    if isinstance(target_batch, (np.ndarray, list)):
        target_batch = np.asarray(target_batch, dtype="int32")
    if len(target_batch.shape) != 2 or target_batch.shape[1] < 2:
        raise ValueError(f"target_batch must be (batch, t) with t >= 2, got shape "
                         f"{tuple(target_batch.shape)}")
    return target_batch[:, :-1], target_batch[:, 1:]


def _check_seed(seed):
    if int(seed) < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed}")
    return int(seed)


def _positive(name, value):
    if value is None or int(value) < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return int(value)


class _EpochDataset(keras.utils.PyDataset):
    """PyDataset whose content is a pure function of ``(seed, epoch)``.

    ``on_epoch_end`` advances the epoch only when every batch was served between Keras'
    ``on_epoch_begin`` and ``on_epoch_end`` calls (over one or more of them, so partial
    epochs with ``steps_per_epoch`` add up). Keras' ``fit`` also fetches a batch or two
    and calls ``on_epoch_end`` before its first epoch (to build the model, to infer the
    tf.data signature); those calls do not skip an epoch, so ``fit(epochs=n)`` serves
    epochs ``0 .. n-1`` on every backend. For a resume call ``set_epoch(initial_epoch)``
    or pass :class:`EpochSync` to ``fit`` (also needed with ``use_multiprocessing=True``,
    where batches are served in worker processes).
    """

    def __init__(self, seed, **kwargs):
        super().__init__(**kwargs)
        self.seed = _check_seed(seed)
        self.epoch = 0
        self._served, self._in_epoch = set(), False

    def set_epoch(self, epoch):
        """Serve epoch ``epoch`` next (e.g. ``initial_epoch`` when resuming)."""
        self.epoch = int(epoch)
        self._served = set()

    def _mark_served(self, i):
        if self._in_epoch:
            self._served.add(i)

    def on_epoch_begin(self):
        """Called by Keras before an epoch's batches."""
        self._in_epoch = True

    def on_epoch_end(self):
        """Called by Keras after an epoch: advance once every batch was served."""
        self._in_epoch = False
        if len(self._served) >= len(self):
            self.set_epoch(self.epoch + 1)


class EpochSync(keras.callbacks.Callback):
    """Keras callback: at the start of each ``fit`` epoch ``e``, ``set_epoch(e)`` on datasets.

    This makes the data of Keras epoch ``e`` exactly the dataset's epoch ``e``, also when
    resuming with ``fit(initial_epoch=e)``.
    """

    def __init__(self, *datasets):
        super().__init__()
        self.datasets = datasets

    def on_epoch_begin(self, epoch, logs=None):
        for dataset in self.datasets:
            dataset.set_epoch(epoch)


def sequence_lengths(sequences):
    """Lengths of a list of id sequences, or the ``lengths`` array of a
    :class:`~transformerkit.data.token_cache.RaggedIds` (no pass over the sequences):
    int64 ``(n,)``."""
    lengths = getattr(sequences, "lengths", None)
    if lengths is not None:
        return np.asarray(lengths, dtype=np.int64)
    return np.array([len(s) for s in sequences], dtype=np.int64)


class _BucketedBatches(_EpochDataset):
    """Batches of examples cut by length: the shared part of :class:`TranslationBatches`
    and :class:`ClassificationBatches` (subclasses say how wide each example's arrays are,
    in ``widths``, and build a batch in ``__getitem__``).

    An example's length is the largest of its padded ``widths``. With ``bucket=True``
    examples are sorted by length (ties in a random order drawn from ``(seed, epoch)``) and
    cut into consecutive batches: with ``tokens_per_batch`` a batch takes examples while
    ``rows * longest <= tokens_per_batch``; with ``batch_size``, ``batch_size`` examples.
    The order of the batches is then shuffled from ``(seed, epoch)``. Cut points depend only
    on the sorted lengths, so ``len(self)`` is the same every epoch. With ``bucket=False``
    (``batch_size`` only) examples are cut from a random permutation instead.
    ``shuffle=False`` keeps sorted (or corpus) order, the same every epoch.
    """

    def __init__(self, count, tokens_per_batch=None, batch_size=None, shuffle=True, seed=0,
                 bucket=True, pad_to_multiple=1, what="examples", **kwargs):
        super().__init__(seed, **kwargs)
        if (tokens_per_batch is None) == (batch_size is None):
            raise ValueError("give exactly one of tokens_per_batch and batch_size, got "
                             f"tokens_per_batch={tokens_per_batch}, batch_size={batch_size}")
        if tokens_per_batch is not None and not bucket:
            raise ValueError("tokens_per_batch needs bucket=True (unsorted token-budget "
                             "batches would change count every epoch); use batch_size")
        if count == 0:
            raise ValueError(f"no {what} to batch (is the length filter too strict?)")
        self.shuffle, self.bucket = bool(shuffle), bool(bucket)
        self.tokens_per_batch = (None if tokens_per_batch is None
                                 else _positive("tokens_per_batch", tokens_per_batch))
        self.batch_size = None if batch_size is None else _positive("batch_size", batch_size)
        self.pad_to_multiple = _positive("pad_to_multiple", pad_to_multiple)

    def _set_widths(self, *widths):
        """``widths``: per array of an example, ``(n,)`` padded widths; sets the lengths
        and cut points and draws epoch 0."""
        self.widths = widths
        self.lengths = np.maximum.reduce(widths)
        if self.tokens_per_batch and self.lengths.max() > self.tokens_per_batch:
            raise ValueError(f"tokens_per_batch={self.tokens_per_batch} is smaller than the "
                             f"longest example ({self.lengths.max()} tokens); raise it or "
                             "lower max_length")
        self._cuts = self._cut_points()
        self.set_epoch(0)

    def _cut_points(self):
        """Start offsets of the batches in length-sorted (or permuted) order, + the end."""
        n = len(self.lengths)
        if self.batch_size:
            return list(range(0, n, self.batch_size)) + [n]
        cuts, rows, longest = [0], 0, 0
        for length in np.sort(self.lengths).tolist():  # greedy: fill while within budget
            if (rows + 1) * max(longest, length) > self.tokens_per_batch:
                cuts.append(cuts[-1] + rows)
                rows, longest = 0, 0
            rows, longest = rows + 1, max(longest, length)
        return cuts + [n]

    def set_epoch(self, epoch):
        """Draw the batches of epoch ``epoch`` (a pure function of ``(seed, epoch)``)."""
        super().set_epoch(epoch)
        rng = np.random.default_rng([self.seed, self.epoch])
        n = len(self.lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        if self.bucket:
            order = order[np.argsort(self.lengths[order], kind="stable")]
        batches = [order[a:b] for a, b in zip(self._cuts[:-1], self._cuts[1:], strict=True)]
        if self.shuffle:
            batches = [batches[j] for j in rng.permutation(len(batches))]
        self.batches = _distinct_shapes_first(batches, self._shapes(batches))

    def _shapes(self, batches):
        """``(num_batches, 1 + arrays)``: rows and each array's width, per batch."""
        return np.array([(len(rows), *(w[rows].max() for w in self.widths))
                         for rows in batches])

    def _round_up(self, widths):
        return -(-widths // self.pad_to_multiple) * self.pad_to_multiple

    def __len__(self):
        return len(self._cuts) - 1

    def _rows(self, i):
        """The example indices of batch ``i`` (marking it served)."""
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} out of range for {len(self)} batches")
        self._mark_served(i)
        return self.batches[i]


class TranslationBatches(_BucketedBatches):
    """Length-bucketed, token-budgeted batches of an :class:`EncodedPairs` (or of the
    memory-mapped :class:`~transformerkit.data.token_cache.CachedPairs`: only the lengths
    are read up front, a batch's ids when it is served).

    Each batch is ``((source_ids, decoder_input_ids), labels)``: int32, right-padded with
    0, shapes ``(rows, source_len)``, ``(rows, target_len - 1)``, ``(rows, target_len - 1)``.

    Batching as :class:`_BucketedBatches`, a pair's length being ``max(len(source),
    len(target))`` (the padded size of the larger of its two arrays is what the token budget
    counts). Every pair is in exactly one batch per epoch. In every case two batches whose
    shapes differ in each dimension that varies are moved to the front, because Keras'
    TensorFlow backend fixes any dimension that is equal in batches 0 and 1 (see
    :func:`_distinct_shapes_first`).

    Epochs: ``on_epoch_end`` advances to the next epoch once all batches were served, and
    ``set_epoch`` jumps to one (``set_epoch(initial_epoch)`` before ``fit`` for an exact
    resume, or pass ``EpochSync(batches)`` in the callbacks).

    Args:
        encoded: :class:`EncodedPairs`.
        tokens_per_batch: int token budget per batch, or None.
        batch_size: int rows per batch, or None. Exactly one of the two is set.
        shuffle: bool, see above. seed: int >= 0. bucket: bool, see above.
        pad_to_multiple: int, pad source and decoder-input widths up to a multiple of it
            (fewer distinct shapes, so fewer recompilations on JAX / TensorFlow); the padded
            size is what the token budget counts. 1 = no extra padding.
        **kwargs: ``keras.utils.PyDataset`` options (workers, use_multiprocessing, ...).

    Example:
    >>> batches = TranslationBatches(encode_pairs(src, tgt, tok, tok, 64), tokens_per_batch=4096)
    >>> model.fit(batches, epochs=10, shuffle=False, callbacks=[EpochSync(batches)])
    """

    def __init__(self, encoded, tokens_per_batch=None, batch_size=None, shuffle=True, seed=0,
                 bucket=True, pad_to_multiple=1, **kwargs):
        super().__init__(len(encoded), tokens_per_batch, batch_size, shuffle, seed, bucket,
                         pad_to_multiple, what="pairs", **kwargs)
        self.encoded = encoded
        # Padded widths per pair: source, target (BOS..EOS) = decoder input + 1.
        self.source_widths = self._round_up(sequence_lengths(encoded.source))
        self.target_widths = self._round_up(sequence_lengths(encoded.target) - 1) + 1
        self._set_widths(self.source_widths, self.target_widths)

    def __getitem__(self, i):
        rows = self._rows(i)
        source = pad_batch([self.encoded.source[j] for j in rows],
                           self.source_widths[rows].max())  # (b, s)
        target = pad_batch([self.encoded.target[j] for j in rows],
                           self.target_widths[rows].max())  # (b, t)
        decoder_input, labels = teacher_forcing(target)  # (b, t-1), (b, t-1)
        return (source, decoder_input), labels


@dataclasses.dataclass
class EncodedTexts:
    """Encoded texts with one class id each (sequence classification).

    Attributes:
        ids: list of int32 arrays ``(len,)``: ``[BOS] + pieces + [EOS]`` (BERT's ``[CLS] ...
            [SEP]``), at most ``max_length`` long.
        labels: int32 ``(n,)`` class ids.
        truncated: int, texts cut to ``max_length`` by :func:`encode_texts`.
    """

    ids: list
    labels: np.ndarray
    truncated: int = 0

    def __post_init__(self):
        self.labels = np.asarray(self.labels, dtype="int32")
        if len(self.ids) != len(self.labels):
            raise ValueError(f"{len(self.ids)} texts but {len(self.labels)} labels")

    def __len__(self):
        return len(self.ids)


def encode_texts(texts, tokenizer, max_length, labels=None):
    """Tokenize texts as an encoder reads them: ``[BOS] + pieces + [EOS]``, longer ones cut
    to ``max_length`` tokens (keeping BOS and the final EOS, as BERT's truncation).

    Returns :class:`EncodedTexts` (``labels``: int class ids, default all 0).
    """
    if int(max_length) < 3:
        raise ValueError(f"max_length must be >= 3 (BOS, a token, EOS), got {max_length}")
    encoded = tokenizer.encode_batch(list(texts), add_bos=True, add_eos=True)
    ids, truncated = [], 0
    for sequence in encoded:
        if len(sequence) > max_length:
            sequence = sequence[:max_length - 1] + sequence[-1:]
            truncated += 1
        ids.append(np.asarray(sequence, dtype="int32"))
    labels = np.zeros(len(ids), "int32") if labels is None else labels
    return EncodedTexts(ids, labels, truncated)


class ClassificationBatches(_BucketedBatches):
    """Length-bucketed batches of :class:`EncodedTexts` for sequence classification.

    Each batch is ``(ids, labels)``: ids int32 ``(rows, len)`` right-padded with 0, labels
    int32 ``(rows,)``. Batching, shuffling and epochs as :class:`TranslationBatches` (a
    text's length is its padded width).
    """

    def __init__(self, encoded, tokens_per_batch=None, batch_size=None, shuffle=True, seed=0,
                 bucket=True, pad_to_multiple=1, **kwargs):
        super().__init__(len(encoded), tokens_per_batch, batch_size, shuffle, seed, bucket,
                         pad_to_multiple, what="texts", **kwargs)
        self.encoded = encoded
        self._set_widths(self._round_up(sequence_lengths(encoded.ids)))

    def __getitem__(self, i):
        rows = self._rows(i)
        ids = pad_batch([self.encoded.ids[j] for j in rows], self.widths[0][rows].max())
        return ids, self.encoded.labels[rows]


def _distinct_shapes_first(batches, shapes):
    """Reorder so that batches 0 and 1 differ in every dimension that varies at all.

    Keras' TensorFlow backend infers the ``tf.data`` signature of a PyDataset from its first
    two batches: a dimension equal in both is fixed, and a later batch of another size then
    fails. Two batches are moved to the front (the first pair in the current order that
    differs everywhere needed, searched from a few extreme candidates); the rest keep their
    order. ``shapes`` is ``(num_batches, dims)``.
    """
    if len(batches) < 3:
        return batches
    varying = (shapes != shapes[0]).any(axis=0)  # (dims,)
    candidates = dict.fromkeys([0, *np.argmin(shapes, 0), *np.argmax(shapes, 0)])
    for a in candidates:
        differs = ((shapes != shapes[a]) | ~varying).all(axis=1)  # (num_batches,)
        if differs.any():
            b = int(np.argmax(differs))
            rest = [x for j, x in enumerate(batches) if j not in (a, b)]
            return [batches[a], batches[b], *rest]
    return batches


class LanguageModelBatches(_EpochDataset):
    """Random contiguous blocks of a token stream for a causal LM (nanoGPT's ``get_batch``).

    Batch ``i`` of epoch ``e`` takes ``batch_size`` random windows of ``block_size + 1``
    tokens (drawn from ``(seed, e, i)``, so any batch can be rebuilt alone) and returns
    ``(x, y)`` = ``(window[:, :-1], window[:, 1:])``, both int32 ``(batch_size, block_size)``.

    Args:
        tokens: 1-D int array, the encoded corpus. block_size: int, context length.
        batch_size: int rows. steps_per_epoch: int, batches per epoch. seed: int >= 0.
        **kwargs: ``keras.utils.PyDataset`` options.
    """

    def __init__(self, tokens, block_size, batch_size, steps_per_epoch, seed=0, **kwargs):
        super().__init__(seed, **kwargs)
        self.tokens = np.asarray(tokens, dtype="int32")
        if self.tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {self.tokens.shape}")
        self.block_size = _positive("block_size", block_size)
        self.batch_size = _positive("batch_size", batch_size)
        self.steps_per_epoch = _positive("steps_per_epoch", steps_per_epoch)
        if len(self.tokens) < self.block_size + 1:
            raise ValueError(f"need at least block_size + 1 = {self.block_size + 1} tokens, "
                             f"got {len(self.tokens)}")

    def __len__(self):
        return self.steps_per_epoch

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} out of range for {len(self)} batches")
        self._mark_served(i)
        rng = np.random.default_rng([self.seed, self.epoch, i])
        starts = rng.integers(0, len(self.tokens) - self.block_size, size=self.batch_size)
        windows = self.tokens[starts[:, None] + np.arange(self.block_size + 1)]  # (b, T+1)
        return windows[:, :-1], windows[:, 1:]


def split_train_val(tokens, val_fraction=0.1):
    """First ``1 - val_fraction`` of the tokens for training, the rest for validation
    (nanoGPT shakespeare_char: ``n = int(0.9 * len)``)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n = int(len(tokens) * (1.0 - val_fraction))
    return tokens[:n], tokens[n:]
