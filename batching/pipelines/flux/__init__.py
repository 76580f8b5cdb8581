"""FLUX.1 (dev, schnell): the adapter, its mixed-size attention, its step cache and builtin:tiny-flux."""
