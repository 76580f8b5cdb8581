"""The built-in models' builders, one per family: each builds its family's diffusers pipeline at toy
size from a config with seeded weights (core.builtin_models names them; the shared
seeded construction is batching.builtin_models.components)."""
