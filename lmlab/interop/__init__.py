"""Interoperability with Hugging Face transformers: import, export, parity."""
