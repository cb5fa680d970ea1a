"""Verification: run our decoder and transformers on the same tokens and compare them, from the logits
down to every sublayer; the only room that runs transformers as the reference."""
