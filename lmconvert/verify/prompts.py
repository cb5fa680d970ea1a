"""The token batch `verify` runs: real text through the checkpoint's own tokenizer when it has one
(agreement on the distributions a model actually sees), random ids otherwise.

Batches are unpadded, so the text is tokenized as one stream and cut into rows of equal length,
each starting with BOS when the tokenizer has one.
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
def random_batch(vocab_size: int, batch: int, seq_len: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq_len), generator=generator)


def prompt_batch(where: Loadable, vocab_size: int, batch: int, seq_len: int) -> torch.Tensor:
    """Rows of real text from the built-in TEXTS; raises ValueError when the tokenizer is unusable
    or yields ids outside the model's vocabulary."""
    tokenizer = load_tokenizer(where)
    stream = tokenizer.encode("\n\n".join(TEXTS), add_special_tokens=False)
    if not stream:
        raise ValueError("the tokenizer produced no tokens")
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    width = seq_len - len(bos)
    while len(stream) < batch * width:
        stream = stream + stream
    rows = [bos + stream[i * width:(i + 1) * width] for i in range(batch)]
    ids = torch.tensor(rows, dtype=torch.long)
    if int(ids.max()) >= vocab_size or int(ids.min()) < 0:
        raise ValueError(f"token id {int(ids.max())} is outside the model's vocabulary of {vocab_size}")
    return ids


def token_batch(tokenizers: list[Loadable | None], vocab_size: int, batch: int, seq_len: int,
                seed: int) -> tuple[torch.Tensor, str]:
    """(ids, where they came from): "prompts (NAME tokenizer)" from the first tokenizer that
    works, else "random ids (why)"."""
    why = "no tokenizer files"
    for where in tokenizers:
        if where is None:
            continue
        try:
            return prompt_batch(where, vocab_size, batch, seq_len), f"prompts ({Path(str(where)).name} tokenizer)"
        except Exception as exc:  # noqa: BLE001 - any tokenizer failure means: fall back to random ids
            why = f"tokenizer unusable: {str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__}"
    return random_batch(vocab_size, batch, seq_len, seed), f"random ids ({why})"
