"""Running the canonical decoder on a checkpoint: `lmconvert.load`, the streamed decoder, generation
and the architecture card."""
