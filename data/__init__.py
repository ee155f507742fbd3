"""Text to packed token blocks: corpus.py (where the text comes from), tokenizer.py (byte-level BPE, packing),
datamodule.py (the LightningDataModule train.py configures as `data.*`)."""
