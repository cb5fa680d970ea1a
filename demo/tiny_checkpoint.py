"""Write a tiny random LLaMA checkpoint with a real tokenizer, using transformers' own classes.

The embedded default for `make demo` until a real checkpoint ships with the project. Every
parameter is perturbed away from its init so the parity check has something to find.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TEXT = ["The capital of France is Paris.", "Checkpoints move between formats without changing a logit.",
        "def add(a, b):\n    return a + b", "Le chat dort. 猫在睡觉。"] * 8


def tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXT, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def main(out: Path) -> None:
    tok = tokenizer(384)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 64})
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"wrote a tiny LLaMA checkpoint to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
