"""Z-Image: the adapter, its step cache, builtin:tiny-zimage and builtin:shapes-dit's architecture."""
