"""Small random Hugging Face GPT-2 folders written by ``transformers`` itself, with a
byte-level BPE trained by ``tokenizers`` and saved as ``GPT2TokenizerFast``: the checkpoints
of the GPT-2 import and export tests (``models/test_gpt2_import.py``, ``test_importing.py``,
``export/test_export_huggingface.py``)."""

CORPUS = [
    "A man in an orange hat starring at something.",
    "Two young, White males are outside near many bushes.",
    "A little girl climbing into a wooden playhouse.",
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "Un café à Paris coûte 3,50 € en 2024; déjà vu!",
    "The 12 dogs ran 1,000 meters in 3.5 minutes.",
    "She said: \"don't go\" -- and he didn't.",
] * 8
END = "<|endoftext|>"


def byte_level_bpe(vocab_size=300):
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_special_tokens([END])  # the last id, as in GPT-2 (id 0 is "!")
    return transformers.GPT2TokenizerFast(tokenizer_object=tokenizer, bos_token=END,
                                          eos_token=END, unk_token=END)


def tiny_gpt2(folder, tokenizer=None, seed=0, **overrides):
    """Save a small random GPT-2 (and ``tokenizer``) to ``folder``; the eval-mode model and
    the tokenizer. Every parameter is redrawn at a larger scale (LayerNorm gains around 1)
    so that a swapped, untransposed or unsplit tensor changes the output."""
    import torch
    import transformers

    tokenizer = tokenizer or byte_level_bpe()
    end = tokenizer.convert_tokens_to_ids(END)
    settings = dict(vocab_size=len(tokenizer), n_positions=40, n_embd=32, n_layer=3,
                    n_head=4, activation_function="gelu_new", bos_token_id=end,
                    eos_token_id=end)
    config = transformers.GPT2Config(**{**settings, **overrides})
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "ln" in name and name.endswith("weight"):
                parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
            else:
                parameter.normal_(0.0, 0.2)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return model, tokenizer


