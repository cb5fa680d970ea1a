"""The token batch `verify` runs: real text through the checkpoint's own tokenizer when it has one
(agreement on the distributions a model actually sees), random ids otherwise.

The text is tokenized as one stream and cut into rows, each starting with BOS when the tokenizer
has one. Rows are of equal length, or with `padded` of different lengths, left-padded with id 0
under an attention mask (the first row full, each next one shorter), as batched generation runs.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lmconvert.formats.source import Loadable
from lmconvert.runtime.tokenizer import load_tokenizer

# English prose, code, a list, numbers, dialogue and a little French and German: varied enough to
# reach many parts of a vocabulary, short enough to ship.
TEXTS = (
    "The capital of France is Paris. It sits on the Seine, and its museums hold some of the most "
    "visited paintings in the world.",
    "def fibonacci(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "Shopping list: three apples, a loaf of rye bread, 250 g of butter, milk, and two lemons for the tart.",
    "Q: What is 17 times 23?\nA: 17 x 23 = 391. Check: 391 / 23 = 17.",
    "\"Are you coming tonight?\" she asked. \"Only if the train is on time,\" he said, and looked at the clock.",
    "La gare est fermée le dimanche. Der Zug nach Berlin fährt um 8:15 Uhr von Gleis 4 ab.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong and Buzz Aldrin walked on its surface for about "
    "two and a half hours while Michael Collins orbited above.",
    "SELECT name, COUNT(*) AS orders FROM customers JOIN orders USING (id) GROUP BY name ORDER BY orders DESC;",
)
def padded_lengths(batch: int, seq_len: int) -> list[int]:
    """Each row's real tokens: the first row full, the last about half, never fewer than one."""
    return [max(1, seq_len - (i * seq_len) // (2 * max(1, batch - 1))) for i in range(batch)]


def left_pad(rows: list[list[int]], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask) of rows left-padded with id 0 to seq_len."""
    ids = torch.tensor([[0] * (seq_len - len(row)) + row for row in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (seq_len - len(row)) + [1] * len(row) for row in rows], dtype=torch.long)
    return ids, mask


def random_batch(vocab_size: int, batch: int, seq_len: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq_len), generator=generator)


def prompt_batch(where: Loadable, vocab_size: int, batch: int, seq_len: int,
                 lengths: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ids, attention mask or None): rows of real text from the built-in TEXTS, of `lengths`
    tokens left-padded when given; raises ValueError when the tokenizer is unusable or yields ids
    outside the model's vocabulary."""
    tokenizer = load_tokenizer(where)
    stream = tokenizer.encode("\n\n".join(TEXTS), add_special_tokens=False)
    if not stream:
        raise ValueError("the tokenizer produced no tokens")
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    widths = [max(0, n - len(bos)) for n in (lengths or [seq_len] * batch)]
    while len(stream) < sum(widths):
        stream = stream + stream
    starts = [sum(widths[:i]) for i in range(batch)]
    rows = [bos + stream[start:start + width] for start, width in zip(starts, widths, strict=True)]
    ids, mask = left_pad(rows, seq_len)
    if int(ids.max()) >= vocab_size or int(ids.min()) < 0:
        raise ValueError(f"token id {int(ids.max())} is outside the model's vocabulary of {vocab_size}")
    return ids, (mask if lengths is not None else None)


def token_batch(tokenizers: list[Loadable | None], vocab_size: int, batch: int, seq_len: int,
                seed: int, padded: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """(ids, attention mask or None, where they came from): "prompts (NAME tokenizer)" from the
    first tokenizer that works, else "random ids (why)"; with `padded`, rows of `padded_lengths`,
    left-padded, and the text says so."""
    lengths = padded_lengths(batch, seq_len) if padded else None
    shape = f", left-padded rows of {', '.join(map(str, lengths))} tokens" if lengths else ""
    why = "no tokenizer files"
    for where in tokenizers:
        if where is None:
            continue
        try:
            ids, mask = prompt_batch(where, vocab_size, batch, seq_len, lengths)
            return ids, mask, f"prompts ({Path(str(where)).name} tokenizer){shape}"
        except Exception as exc:  # noqa: BLE001 - any tokenizer failure means: fall back to random ids
            why = f"tokenizer unusable: {str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__}"
    ids = random_batch(vocab_size, batch, seq_len, seed)
    if lengths is None:
        return ids, None, f"random ids ({why})"
    ids, mask = left_pad([row[seq_len - n:] for row, n in zip(ids.tolist(), lengths, strict=True)], seq_len)
    return ids, mask, f"random ids ({why}){shape}"
