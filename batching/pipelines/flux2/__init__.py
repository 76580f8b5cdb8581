"""FLUX.2 (dev) and FLUX.2 [klein]: the adapters, their mixed-size attention and builtin:tiny-flux2(-klein)."""
