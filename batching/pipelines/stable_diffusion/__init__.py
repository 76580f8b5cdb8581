"""Stable Diffusion 1.x/2.x and SDXL (UNet families): the adapters, their step cache (DeepCache) and the built-ins."""
