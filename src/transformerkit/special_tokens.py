"""The four reserved tokens at the start of every vocabulary: their spellings and ids.

    ======  ==  ================================================
    token   id  meaning
    ======  ==  ================================================
    <pad>   0   padding (masked everywhere in the models)
    <s>     1   begin of sequence (first decoder input token)
    </s>    2   end of sequence (last label; stops decoding)
    <unk>   3   unknown token
    ======  ==  ================================================

The ids are the positions in :data:`SPECIAL_TOKENS`. This module is a leaf (no imports)
so that the lowest layer that needs an id (``layers.masks`` masks ``PAD_ID``) and the
tokenizers in ``data`` can both read it without one depending on the other.
"""

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))
