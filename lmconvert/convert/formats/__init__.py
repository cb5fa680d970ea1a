"""Checkpoint formats beyond HF safetensors: PyTorch `.bin` pickles (read only) and Meta's original
LLaMA layout (read and write).

Readers present every format in transformers' layout (an HF config dict and tensors under HF
names) and register in `lmconvert.convert.sources.FORMATS`; the family mappings do the rest.
"""
