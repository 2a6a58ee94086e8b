"""The call description: array interop, logical dtypes and validation, checked on metadata alone."""
