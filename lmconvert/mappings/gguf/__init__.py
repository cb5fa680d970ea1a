"""llama.cpp's GGUF conventions as data: the architecture entry each family declares (`archs`), the
metadata keys (`metadata`), export (`export`), the pre-tokenizers and transformers' GGUF loaders."""
