"""Qwen-Image and Qwen-Image-Edit: the adapters, their mixed-shape attention, the edit processor and the built-ins."""
