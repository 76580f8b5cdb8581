"""Wan 2.1 / 2.2 video: the adapter, its transformer over rows of mixed shapes and two experts, its samplers, its
image-to-video conditioning and the built-ins."""
