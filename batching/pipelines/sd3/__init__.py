"""Stable Diffusion 3 / 3.5: the adapter, its mixed-size forward and builtin:tiny-sd3."""
