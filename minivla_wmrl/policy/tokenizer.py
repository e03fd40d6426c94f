"""The MiniVLA prompt, the action tokens of the tokenizer, and a code-built tokenizer for tests.

MiniVLA uses the Qwen2.5 tokenizer plus 256 added tokens `<|extra_0|>`…`<|extra_255|>`; the last
`codebook_size` ids of the tokenizer are the action tokens (code c ↔ id len − 1 − c).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
EXTRA_TOKENS = [f"<|extra_{i}|>" for i in range(256)]
END_TOKENS = ("<|im_end|>", "<|endoftext|>")


def build_prompt(instruction: str) -> str:
    """The Qwen chat prompt MiniVLA was trained with (instruction lower-cased)."""
    return (f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n"
            f"What action should the robot take to {instruction.lower()}?<|im_end|>\n<|im_start|>assistant\n")


def add_action_tokens(tokenizer) -> None:
    """Add `<|extra_0..255|>` (as MiniVLA does to the base Qwen tokenizer) when they are missing."""
    missing = [t for t in EXTRA_TOKENS if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)


def check_action_tokens(tokenizer, codebook_size: int) -> None:
    """The last `codebook_size` ids must be <|extra_{256 - codebook_size}|> … <|extra_255|>."""
    vocab_len = len(tokenizer)
    expected = EXTRA_TOKENS[256 - codebook_size:]
    found = tokenizer.convert_ids_to_tokens(list(range(max(0, vocab_len - codebook_size), vocab_len)))
    if found != expected:
        raise ValueError(f"tokenizer (len {vocab_len}) lacks the action tokens: its last {codebook_size} ids should be "
                         f"{expected[0]} … {expected[-1]}, found {found[0]!r} … {found[-1]!r}; add them with "
                         "minivla_wmrl.policy.tokenizer.add_action_tokens (MiniVLA adds <|extra_0..255|> to Qwen's)")
    for token in END_TOKENS + ("<|im_start|>",):
        if token not in tokenizer.get_vocab():
            raise ValueError(f"tokenizer lacks the Qwen chat token {token}")


def tiny_qwen_style_tokenizer():
    """A byte-level tokenizer with Qwen's chat tokens and the 256 extra tokens, built in code.

    No tokenizer can be downloaded here; this one has the same special tokens and action-token
    layout as MiniVLA's (515 tokens), so every code path runs unchanged in tests and demos.
    """
    from transformers import PreTrainedTokenizerFast  # ~0.5 s: importing the policy must not load transformers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    model = models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[])
    core = Tokenizer(model)
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    add_action_tokens(tokenizer)
    return tokenizer
