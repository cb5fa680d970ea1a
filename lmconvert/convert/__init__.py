"""Files, downloads and comparison: everything in lmconvert that touches disk or transformers."""
