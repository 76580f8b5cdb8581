"""Generators of the tiny tokenizers the built-in models ship in batching/assets/ (run by hand; tests check
that each shipped folder is what its generator writes)."""
