"""Drop-in names of other attention libraries over flashkit's API.

`flashkit.compat.flash_attn` has flash-attn 2's functions and signatures (flash_attn_func, the packed and
varlen forms, flash_attn_with_kvcache): a model written against flash-attn switches with one import.
"""
