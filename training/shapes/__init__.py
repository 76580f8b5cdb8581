"""Train builtin:shapes from a seed (its weights ship in batching/assets/builtin-shapes/)."""
