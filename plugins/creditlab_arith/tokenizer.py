"""A character-level tokenizer built locally (no hub access).

Every printable ASCII character plus ``\\n`` and ``\\t`` is one token; the thought delimiter and
``\\boxed{`` are single (non-special) added tokens, matched before pre-tokenization. The
post-processor prepends ``<s>`` when ``add_special_tokens=True`` (the default), like Llama
tokenizers. Encoding then decoding (``skip_special_tokens=True``) returns the text exactly for
any text over the alphabet.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
BOXED = "\\boxed{"
#: Characters with their own token: printable ASCII (space included), newline and tab.
ALPHABET = "".join(sorted(set(string.printable) - {"\r", "\x0b", "\x0c"}))


def build_char_tokenizer(delimiter: str = "</thought>") -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer.

    Args:
        delimiter: The thought delimiter, added as one token.

    Returns:
        A ``PreTrainedTokenizerFast`` with ``pad != eos``, ``bos`` prepended on encode, and the
        delimiter and ``\\boxed{`` as single tokens.
    """
    specials = [PAD, BOS, EOS, UNK]
    vocab = {tok: i for i, tok in enumerate(specials + list(ALPHABET))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # [\s\S] matches any character, newline included (a bare "." would drop newlines).
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    extra = [t for t in dict.fromkeys([delimiter, BOXED]) if len(t) > 1]
    tok.add_tokens(extra)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
