"""Adapters that plug flashkit into other frameworks; they only call flashkit's public API.

`flashkit.integrations.transformers.register()` adds "flashkit" to Hugging Face transformers' attention
implementations.
"""
