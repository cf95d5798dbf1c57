"""Each model's options as one dataclass: defaults, allowed values, checks, derived values.

:class:`ModelOptions` holds the options all three models take, defaulting to the paper's
base model (section 3, table 3); :class:`TransformerOptions`, :class:`GPTOptions` and
:class:`EncoderOptions` add each model's own options and defaults. Building one validates
the values (a ``ValueError`` naming the option; :func:`transformerkit.declared.check`, as
for the decoding options and the config), normalises their types and fills the
derived ones (``key_dim = d_model // num_heads``, ...). A model builds its options from its
constructor arguments, sets one attribute per field and returns the fields from
``get_config``; ``build_model`` takes a run config's ``model:`` keys by these fields and
:mod:`transformerkit.config` derives that section's schema from them (``transformerkit
config`` prints each field's ``help``), so an option is declared here once (plus its
constructor argument and docstring).

Each field comes from :func:`transformerkit.declared.option`; ``own_default=True`` marks a
convention each model sets its own way (the paper's, GPT-2's): a run config leaves it to
the model rather than giving it the paper's value. Values are converted to the declared
type (``64.0`` for an int gives ``64``), as the constructors have always taken them.

The fields are keyword-only: with one shared base no field order can follow all three
constructors' positional orders (each interleaves its own options with the shared ones), so
the constructors keep their explicit signatures, the public API, and
``tests/models/test_options.py`` checks them against these fields (same names, same defaults).

Pretrained embedding matrices (``source_embeddings``, ``target_embeddings``,
``embeddings``) are constructor arguments but not options: they are initial weights, saved
with the weights rather than in ``get_config``, and no config value, so the models take
them beside their options.

Plain Python, no Keras: the allowed values repeat the layers' own (``tests/models/test_options.py``
checks that they agree), as the layers modules import Keras.
"""

from dataclasses import MISSING, dataclass, fields

from transformerkit.declared import check, option
from transformerkit.declared import value_type as value_type  # the config schema's types

NORM_POSITIONS = ("post", "pre")  # LayerNorm after (the paper) or before each sublayer
ACTIVATIONS = ("relu", "gelu", "swish", "gelu_tanh")
POSITIONAL_KINDS = ("sinusoidal", "sinusoidal_split", "t2t", "learned")
TIE_OPTIONS = ("none", "decoder", "all")
INITIALIZATIONS = ("gpt2", "paper")
POOLING = (None, "cls", "mean")
SCALE_EMBEDDINGS_HELP = ("multiply the token embeddings by sqrt(d_model) (the paper, OPUS-MT; "
                         "not GPT-2, BERT)")


def redefault(options_class, name, default):
    """Option ``name`` of ``options_class`` (its whole declaration) with another default: a
    model's own default for an option it shares."""
    metadata = next(f for f in fields(options_class) if f.name == name).metadata
    return option(default, **metadata)


def config_fields(options_class):
    """The fields a run config may set: all but the vocabulary sizes (no default), which
    come from the data."""
    return [f for f in fields(options_class) if f.default is not MISSING]


@dataclass(kw_only=True)
class ModelOptions:
    """The options every model takes (see ``Transformer``'s docstring for each)."""

    num_layers: int = option(6, help="number of blocks (Transformer: encoder blocks, and "
                                     "decoder blocks unless num_decoder_layers)")
    d_model: int = option(512, help="model width: embeddings and the residual stream")
    num_heads: int = option(8, help="attention heads per attention layer")
    d_ff: int = option(2048, help="inner width of each feed-forward network")
    dropout: float = option(0.1, help="dropout on the embeddings and on each sublayer's "
                                      "output (residual dropout)")
    max_length: int = option(256, help="longest sequence the model accepts, in tokens (also "
                                       "the data's length limit unless data.max_length)")
    norm_position: str = option(
        "post", choices=NORM_POSITIONS, own_default=True,
        help="LayerNorm after each sublayer (post, the paper) or before it (pre, GPT-2)")
    activation: str = option("relu", choices=ACTIVATIONS, own_default=True,
                             help="feed-forward activation: relu (the paper), gelu (exact, "
                                  "BERT), gelu_tanh (its tanh approximation, GPT-2's) or swish "
                                  "(x sigmoid(x), SiLU: Marian, OPUS-MT)")
    positional: str = option(
        "sinusoidal", choices=POSITIONAL_KINDS, own_default=True,
        help="positions: sinusoidal (the paper), sinusoidal_split (the paper's frequencies, "
             "all sines then all cosines: Marian, OPUS-MT), t2t (tensor2tensor's timescales) "
             "or learned")
    min_timescale: float = option(
        1.0, help="t2t positions: the shortest timescale (wavelength / 2 pi) of the sines")
    max_timescale: float = option(
        1.0e4, help="the fixed tables (sinusoidal, sinusoidal_split, t2t): the longest "
                    "timescale (the paper's 10000)")
    key_dim: int | None = option(None, help="query/key width per head (null: d_model // "
                                            "num_heads, section 3.2.2)")
    value_dim: int | None = option(None, help="value width per head (null: key_dim)")
    attention_dropout: float = option(0.0, help="dropout on the attention weights")
    activation_dropout: float = option(0.0, help="dropout inside the feed-forward network, "
                                                 "after the activation (t2t's relu_dropout)")
    layer_norm_epsilon: float = option(1e-6, own_default=True,
                                       help="epsilon of every LayerNorm")
    embeddings_trainable: bool = option(True, help="false freezes the token embeddings "
                                                   "(e.g. pretrained ones)")

    @classmethod
    def from_arguments(cls, arguments):
        """The options among a constructor's ``locals()`` (which also hold ``self``, the
        pretrained matrices and Keras' ``kwargs``)."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls)})

    def __post_init__(self):
        for f in fields(self):
            value, problem = check(f, getattr(self, f.name), convert=True)
            if problem:
                raise ValueError(problem.message(f.name))
            setattr(self, f.name, value)
        if self.key_dim is None and self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by "
                             f"num_heads={self.num_heads}; choose another num_heads or set "
                             "key_dim explicitly")
        if self.max_length < 1:
            raise ValueError(f"max_length must be positive, got {self.max_length}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            rate = getattr(self, name)
            if not 0.0 <= rate < 1.0:  # NaN too
                raise ValueError(f"{name} is a probability in [0, 1), got {rate}")
        self._check_timescales()
        self.key_dim = self.key_dim or self.d_model // self.num_heads
        self.value_dim = self.value_dim or self.key_dim


    def _check_timescales(self):
        """The timescales shape the fixed tables only: ``sinusoidal`` has the paper's
        minimum of 1 (its wavelengths run from 2 pi to ``max_timescale`` * 2 pi), ``learned``
        has none; a value that would be ignored is an error."""
        if not 0 < self.min_timescale < self.max_timescale:
            raise ValueError(f"need 0 < min_timescale < max_timescale; got min_timescale="
                             f"{self.min_timescale}, max_timescale={self.max_timescale}")
        if self.positional in ("sinusoidal", "sinusoidal_split") and self.min_timescale != 1.0:
            raise ValueError("min_timescale applies to positional='t2t' only (the paper's "
                             f"{self.positional} table starts at timescale 1)")
        if self.positional == "learned" and (self.min_timescale, self.max_timescale) != (
                1.0, 1.0e4):
            raise ValueError("min_timescale and max_timescale apply to the fixed tables "
                             "(positional sinusoidal or t2t), not to learned positions")


@dataclass(kw_only=True)
class TransformerOptions(ModelOptions):
    """``Transformer``: the paper's encoder-decoder."""

    source_vocab_size: int = option(help="source vocabulary size (id 0 is padding); from "
                                         "the data's tokenizer")
    target_vocab_size: int = option(help="target vocabulary size (id 0 is padding); from "
                                         "the data's tokenizer")
    tie_embeddings: str = option(
        "none", choices=TIE_OPTIONS,
        help="decoder: the output projection is the target embedding (section 3.4); all: the "
             "source embedding too, one vocabulary (GPT: both tie input and output)")
    num_decoder_layers: int | None = option(None, help="decoder blocks (null: num_layers)")
    source_embeddings_trainable: bool | None = option(
        None, help="false freezes the source embedding (null: embeddings_trainable)")
    target_embeddings_trainable: bool | None = option(
        None, help="false freezes the target embedding (null: embeddings_trainable)")
    projection_trainable: bool | None = option(
        None, help="false freezes the output projection (null: trainable; tied embeddings: "
                   "the target embedding's setting, which it is)")
    scale_embeddings: bool = option(True, help=SCALE_EMBEDDINGS_HELP)
    final_logits_bias: bool = option(
        False, help="add a frozen bias vector to the logits (Marian's and BART's "
                    "final_logits_bias, a buffer transformers never trains); with "
                    "tie_embeddings none it replaces the output projection's own bias")

    def __post_init__(self):
        super().__post_init__()
        if self.tie_embeddings == "all" and self.source_vocab_size != self.target_vocab_size:
            raise ValueError(
                "tie_embeddings='all' shares one matrix between source and target, so it needs "
                f"one shared vocabulary, but source_vocab_size={self.source_vocab_size} != "
                f"target_vocab_size={self.target_vocab_size}")
        self.num_decoder_layers = self.num_decoder_layers or self.num_layers
        self.trainable_parts()  # checks the three settings agree where matrices are shared

    def trainable_parts(self):
        """``(source, target, projection)`` trainability of the embeddings and the output
        projection; a ``ValueError`` where tied matrices would be both frozen and trained."""
        source = _either(self.source_embeddings_trainable, self.embeddings_trainable)
        target = _either(self.target_embeddings_trainable, self.embeddings_trainable)
        if self.tie_embeddings == "all" and source != target:
            raise ValueError("tie_embeddings='all' shares one matrix: source_embeddings_"
                             "trainable and target_embeddings_trainable must agree")
        return source, target, _tied_projection(self, target, "target_embeddings_trainable")


def _either(own, shared):
    return shared if own is None else own


def _tied_projection(opts, embedding, embedding_key):
    """The output projection's trainability: its own setting, or (tied) the embedding's."""
    if opts.tie_embeddings == "none":
        return _either(opts.projection_trainable, True)
    if opts.projection_trainable not in (None, embedding):
        raise ValueError(f"tie_embeddings={opts.tie_embeddings!r}: the output projection is the "
                         f"embedding matrix, so projection_trainable={opts.projection_trainable}"
                         f" cannot differ from {embedding_key}={embedding}")
    return embedding


@dataclass(kw_only=True)
class GPTOptions(ModelOptions):
    """``GPT``: decoder only, GPT-2's and nanoGPT's defaults."""

    vocab_size: int = option(help="vocabulary size (id 0 is padding); from the data's "
                                  "tokenizer")
    num_layers: int = redefault(ModelOptions, "num_layers", 4)
    d_model: int = redefault(ModelOptions, "d_model", 128)
    num_heads: int = redefault(ModelOptions, "num_heads", 4)
    d_ff: int = redefault(ModelOptions, "d_ff", 512)
    dropout: float = redefault(ModelOptions, "dropout", 0.0)
    norm_position: str = redefault(ModelOptions, "norm_position", "pre")
    activation: str = redefault(ModelOptions, "activation", "gelu")
    positional: str = redefault(ModelOptions, "positional", "learned")
    layer_norm_epsilon: float = redefault(ModelOptions, "layer_norm_epsilon", 1e-5)
    tie_embeddings: str = redefault(TransformerOptions, "tie_embeddings", "none")
    scale_embeddings: bool = option(False, help=SCALE_EMBEDDINGS_HELP)
    initialization: str = option(
        "gpt2", choices=INITIALIZATIONS,
        help="gpt2: matrices from N(0, 0.02), residual outputs N(0, 0.02/sqrt(2 num_layers)); "
             "paper: the layers' own (Glorot)")
    use_bias: bool = option(True, help="biases in the projections and LayerNorm offsets "
                                       "(false: nanoGPT's bias=False)")
    projection_trainable: bool | None = redefault(TransformerOptions, "projection_trainable",
                                                  None)

    def __post_init__(self):
        super().__post_init__()
        _tied_projection(self, self.embeddings_trainable, "embeddings_trainable")


@dataclass(kw_only=True)
class EncoderOptions(ModelOptions):
    """``Encoder``: BERT-like, with token types, pooling and a classifier head."""

    vocab_size: int = redefault(GPTOptions, "vocab_size", MISSING)
    max_length: int = redefault(ModelOptions, "max_length", 512)
    type_vocab_size: int = option(0, help="token types (segments, BERT's token_type_ids); "
                                          "0: no type embedding")
    embedding_norm: bool = option(False, help="LayerNorm after summing the embeddings (BERT)")
    scale_embeddings: bool = redefault(GPTOptions, "scale_embeddings", True)
    pooling: str | None = option(
        None, choices=POOLING,
        help="null: return the hidden states; cls: BERT's pooler (tanh Dense over the first "
             "token); mean: mean over the real tokens")
    num_classes: int | None = option(None, help="with pooling: a classifier head with this "
                                                "many classes (null: none)")

    def __post_init__(self):
        super().__post_init__()
        if self.num_classes is not None and self.pooling is None:
            raise ValueError("num_classes needs a pooling ('cls' or 'mean') to classify from")


MODEL_OPTIONS = {"transformer": TransformerOptions, "gpt": GPTOptions, "encoder": EncoderOptions}
