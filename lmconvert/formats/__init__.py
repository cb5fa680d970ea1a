"""Every on-disk layout: HF safetensors and `.bin`, Meta's, GGUF and the canonical directory, each a
reader registered in `checkpoint.FORMATS` (and a writer where it has one), plus the streaming shard
writer, digests and atomic outputs. `open_checkpoint` is the one place that asks which format a
path holds.
"""
