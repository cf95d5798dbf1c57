"""A checkpoint's generation settings (``generation_config.json``) as a run's search options.

``transformers``' ``generate`` called with nothing but the inputs searches as the model's
``GenerationConfig`` says: read from ``generation_config.json``, else (older folders) from
the generation keys of ``config.json``, every key it lacks at ``transformers``' default. An
imported translation run writes the same search into its ``config.yaml``'s ``search:``
section (the fields of :class:`~transformerkit.decoding.options.SearchOptions`), so that
``translate`` with no options gives ``generate``'s output token for token:

=====================================  ==================================================
``GenerationConfig`` (its default)     ``search:``
=====================================  ==================================================
num_beams (1)                          beam_size
max_new_tokens, else max_length (20)   max_new_tokens: ``max_length`` counts the decoder
                                       start, so ``max_length - 1``; max_len_a, max_len_b
                                       none (no cap relative to the source)
length_penalty (1.0)                   alpha, with penalty: power (``score / len **
                                       length_penalty``, ``len`` counting the end token)
early_stopping (False)                 stopping: heuristic (False), early (True), exact
                                       (``"never"``)
forced_eos_token_id (none)             forced_eos: true when it is the end token
renormalize_logits (False)             renormalize
no_repeat_ngram_size (0)               no_repeat_ngram_size
bad_words_ids (none)                   nothing: the search never picks the pad or the
                                       decoder start (ours PAD and BOS)
do_sample (False), temperature (1.0),  temperature, top_k (0: none), top_p (1.0: none):
top_k (50), top_p (1.0)                sampling, with one beam
=====================================  ==================================================

A GPT-2 run's ``generation:`` section (the fields of
:class:`~transformerkit.decoding.options.GenerationOptions`) is made the same way by
:func:`generation_section`, so that ``generate`` with no options continues a prompt as
``generate`` does: greedy (``temperature: 0``) unless ``do_sample``, then ``temperature``,
``top_k`` (``transformers``' default 50) and ``top_p``; ``max_new_tokens``,
``min_new_tokens`` and ``no_repeat_ngram_size`` as they are; where there is no
``max_new_tokens``, ``max_length``, which for a decoder-only model counts the prompt's
tokens too (``max_new_tokens: null`` then), and where there is neither, ``transformers``
5's 20 new tokens (``max_new_tokens: 20``; ``generate`` also stops at the last position
the model reads, where ours slides its window on). ``min_length``, which counts the prompt
as well, has no counterpart: named. Beam search
(``num_beams`` > 1) has none in a GPT run's generation either: named, and the run generates
greedily.

What else would change the tokens ``generate`` picks (``repetition_penalty``,
``min_length``, beam sampling, other bad words, ...) has no counterpart in our search:
:func:`search_section` returns it as ``key=value`` texts, which the import logs in one
line. Plain data in, plain data out: the config's ``search:``
section checks the values.
"""

import json
import pathlib

from transformerkit.converters.hf_io import CheckpointError, read_json_object

# transformers' defaults of the keys mapped above (GenerationConfig's global defaults)
DEFAULTS = {"num_beams": 1, "max_length": 20, "max_new_tokens": None, "length_penalty": 1.0,
            "early_stopping": False, "forced_eos_token_id": None, "renormalize_logits": False,
            "bad_words_ids": None, "no_repeat_ngram_size": 0, "do_sample": False,
            "temperature": 1.0, "top_k": 50, "top_p": 1.0}
STOPPING = {True: "early", False: "heuristic", "never": "exact"}
# keys at the value where they change nothing: other values have no counterpart here
NEUTRAL = {"min_length": 0, "min_new_tokens": None, "encoder_no_repeat_ngram_size": 0,
           "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "num_beam_groups": 1,
           "diversity_penalty": 0.0,
           "forced_bos_token_id": None, "suppress_tokens": None, "begin_suppress_tokens": None,
           "sequence_bias": None, "exponential_decay_length_penalty": None,
           "remove_invalid_values": False, "constraints": None, "force_words_ids": None,
           "penalty_alpha": None, "guidance_scale": None, "max_time": None,
           "stop_strings": None, "watermarking_config": None, "low_memory": None,
           "typical_p": 1.0, "min_p": None, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
           "top_h": None}
# sampling's own keys, which a search (do_sample false) never reads
SAMPLING = {"temperature", "top_k", "top_p", "typical_p", "min_p", "epsilon_cutoff",
            "eta_cutoff", "top_h"}
# keys that do not change which tokens are picked (the special ids are checked apart)
NO_EFFECT = {"bos_token_id", "pad_token_id", "use_cache", "num_return_sequences",
             "output_attentions", "output_hidden_states", "output_scores", "output_logits",
             "return_dict_in_generate", "transformers_version", "_from_model_config",
             "cache_implementation", "cache_config", "compile_config",
             "num_assistant_tokens", "num_assistant_tokens_schedule",
             "assistant_confidence_threshold", "assistant_lookbehind", "target_lookbehind",
             "prompt_lookup_num_tokens", "is_assistant"}
SPECIAL = ("eos_token_id", "decoder_start_token_id")
GENERATION_KEYS = set(DEFAULTS) | set(NEUTRAL) | SAMPLING | NO_EFFECT | set(SPECIAL)


def read_generation_config(folder, config):
    """``(settings, path)``: ``folder/generation_config.json`` as a dict, or where there is
    none, the generation keys of ``config`` (its ``config.json``, as ``transformers`` falls
    back to them); ``path`` names the file they came from. :class:`CheckpointError` for a
    file that is not a JSON object."""
    path = pathlib.Path(folder) / "generation_config.json"
    if not path.is_file():
        return ({key: value for key, value in config.items()
                 if key in GENERATION_KEYS and value is not None},
                pathlib.Path(folder) / "config.json")
    return read_json_object(path), path


def search_section(settings, special_ids, max_positions, path="generation_config.json"):
    """``(search, unsupported)`` of an encoder-decoder's generation ``settings``: the
    ``search:`` keys that search as ``generate`` does (see the module's table), and
    ``key=value`` texts for what has no counterpart.

    Args:
        settings: the generation config's keys (:func:`read_generation_config`).
        special_ids: the model's ``eos_token_id``, ``pad_token_id`` and
            ``decoder_start_token_id`` (``config.json``'s, which the model uses).
        max_positions: the decoder's positions (``max_position_embeddings``).
        path: the file the settings came from, for the :class:`CheckpointError` of a
            mapped key that is not a number.
    """
    _check_numbers(settings, path)
    value = {**DEFAULTS, **{key: v for key, v in settings.items() if v is not None}}.get
    sampling = bool(value("do_sample")) and value("num_beams") == 1
    unsupported = _unsupported(settings, special_ids, sampling)
    search = dict(beam_size=int(value("num_beams")), max_len_a=None, max_len_b=None,
                  stopping=STOPPING.get(value("early_stopping"), "heuristic"),
                  forced_eos=_forces_eos(value("forced_eos_token_id"), special_ids,
                                         unsupported),
                  renormalize=bool(value("renormalize_logits")),
                  no_repeat_ngram_size=value("no_repeat_ngram_size"),
                  max_new_tokens=_max_new_tokens(settings, max_positions, unsupported),
                  **_length_penalty(value("length_penalty"), unsupported))
    if value("do_sample") and not sampling:
        unsupported.append(f"do_sample=true with num_beams={value('num_beams')} (beam "
                           "sampling; searched without sampling)")
    if sampling:
        search.update(temperature=float(value("temperature")),
                      top_k=value("top_k") or None,
                      top_p=None if value("top_p") >= 1.0 else float(value("top_p")))
    return search, unsupported


NUMBERS = {"num_beams": int, "max_length": int, "max_new_tokens": int, "top_k": int,
           "no_repeat_ngram_size": int, "min_new_tokens": int, "min_length": int,
           "length_penalty": float, "temperature": float, "top_p": float}


def generation_section(settings, eos_id, max_positions, never=(),
                       path="generation_config.json"):
    """``(generation, unsupported)`` of a decoder-only model's generation ``settings``: the
    ``generation:`` keys that continue a prompt as ``generate`` does (see the module's
    docstring), and ``key=value`` texts for what has no counterpart. ``eos_id`` is
    ``config.json``'s ``eos_token_id`` (the model's end token), ``max_positions`` its
    ``n_positions``, ``never`` the ids our generation never picks (``<pad>`` and ``<s>``
    of a folder in our ids: ``bad_words_ids`` of those change nothing)."""
    _check_numbers(settings, path)
    value = {**DEFAULTS, **{key: v for key, v in settings.items() if v is not None}}.get
    beams = value("num_beams")
    sampling = bool(value("do_sample")) and beams == 1
    special = {"eos_token_id": eos_id, "pad_token_id": None, "decoder_start_token_id": None}
    unsupported = [text for text in _unsupported(settings, special, sampling, set(never))
                   if not text.startswith(("min_length=", "min_new_tokens="))]
    if beams > 1:
        unsupported.append(f"num_beams={beams} (a GPT run generates with one beam: "
                           f"{'greedy' if not value('do_sample') else 'greedy, not sampling'})")
    generation = dict(temperature=float(value("temperature")) if sampling else 0.0,
                      top_k=(value("top_k") or None) if sampling else None,
                      top_p=(None if value("top_p") >= 1.0 else float(value("top_p")))
                      if sampling else None,
                      no_repeat_ngram_size=value("no_repeat_ngram_size"))
    if settings.get("max_new_tokens") is not None:
        generation["max_new_tokens"] = max(1, int(settings["max_new_tokens"]))
    elif settings.get("max_length") is not None:  # it counts the prompt's tokens too
        length = int(settings["max_length"])
        if not 1 <= length <= max_positions:
            unsupported.append(f"max_length={length} (the model reads {max_positions} "
                               f"positions: at most {max_positions})")
        generation.update(max_new_tokens=None, max_length=max(1, min(length, max_positions)))
    else:  # transformers 5: without either, 20 new tokens
        generation["max_new_tokens"] = min(DEFAULTS["max_length"], max_positions)
    if settings.get("min_new_tokens") is not None:
        generation["min_new_tokens"] = max(0, int(settings["min_new_tokens"]))
    if settings.get("min_length") not in (None, 0):
        unsupported.append(f"min_length={settings['min_length']} (it counts the prompt; "
                           "min_new_tokens does not)")
    if settings.get("forced_eos_token_id") is not None:
        unsupported.append(f"forced_eos_token_id={json.dumps(settings['forced_eos_token_id'])}")
    return generation, unsupported


def _check_numbers(settings, path):
    """A :class:`CheckpointError` naming the first mapped key whose value is not a number
    of its kind (an int where ``NUMBERS`` says int; a bool is neither)."""
    for key, kind in NUMBERS.items():
        given = settings.get(key)
        kinds = (int,) if kind is int else (int, float)
        if given is not None and (isinstance(given, bool) or not isinstance(given, kinds)):
            raise CheckpointError(f"{path}: {key}={given!r} must be "
                                  f"{'an integer' if kind is int else 'a number'}")


def _max_new_tokens(settings, max_positions, unsupported):
    """The most tokens an output has, its end token included: ``max_new_tokens``, else
    ``max_length - 1`` (the decoder start is the first of ``max_length``), else
    ``transformers``' default, 20 new tokens within the positions; at most
    ``max_positions`` (named in ``unsupported`` when the config asks for more)."""
    if settings.get("max_new_tokens") is not None:
        wanted, key = int(settings["max_new_tokens"]), "max_new_tokens"
    elif settings.get("max_length") is not None:
        wanted, key = int(settings["max_length"]) - 1, "max_length"
    else:
        return max(1, min(DEFAULTS["max_length"], max_positions - 1))
    if not 1 <= wanted <= max_positions:
        unsupported.append(f"{key}={settings[key]} (the model reads {max_positions} "
                           f"positions: at most {max_positions} new tokens)")
    return max(1, min(wanted, max_positions))


def _length_penalty(exponent, unsupported):
    """``alpha`` and ``penalty`` of ``transformers``' ``length_penalty`` (ours takes
    exponents from 0 to 10: another is named in ``unsupported`` and clipped)."""
    alpha = min(max(float(exponent), 0.0), 10.0)
    if alpha != exponent:
        unsupported.append(f"length_penalty={exponent} (searching with {alpha})")
    return dict(alpha=alpha, penalty="power")


def _forces_eos(forced, special_ids, unsupported):
    """Whether ``forced_eos_token_id`` forces the end token (an int or a list of it)."""
    if forced is None:
        return False
    if set(forced if isinstance(forced, list) else [forced]) == {special_ids["eos_token_id"]}:
        return True
    unsupported.append(f"forced_eos_token_id={forced} (not the end token)")
    return False


def _unsupported(settings, special_ids, sampling, never=None):
    """``key=value`` texts of the ``settings`` that change what ``generate`` picks and have
    no counterpart in our search: neither mapped nor neutral nor without effect. ``never``:
    the ids our search never picks (default: the pad and the decoder start of
    ``special_ids``), whose ``bad_words_ids`` change nothing."""
    found = []
    for key, given in settings.items():
        if key in NO_EFFECT or (key in DEFAULTS and key not in SAMPLING):  # mapped
            continue
        if key in SAMPLING and (not sampling or key in DEFAULTS):  # unread, or mapped
            continue
        if key in SPECIAL:
            if _as_list(given) != [special_ids[key]]:
                found.append(f"{key}={json.dumps(given)}")
        elif key not in NEUTRAL or given != NEUTRAL[key]:
            found.append(f"{key}={json.dumps(given)}")
    if never is None:
        never = {special_ids["pad_token_id"], special_ids["decoder_start_token_id"]}
    found += _bad_words(settings.get("bad_words_ids"), never)
    return found


def _bad_words(bad_words, never):
    """``bad_words_ids`` other than single ids in ``never``, which the search never picks
    anyway."""
    others = [words for words in bad_words or []
              if not (isinstance(words, list) and len(words) == 1 and words[0] in never)]
    return [f"bad_words_ids={json.dumps(others)}"] if others else []


def _as_list(value):
    return value if isinstance(value, list) else [value]


__all__ = ["generation_section", "read_generation_config", "search_section"]
