"""Hugging Face family converters; every module here registers its families on import."""
