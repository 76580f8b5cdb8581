"""Train builtin:shapes-dit, a small Z-Image-family transformer that draws the shapes prompts at several sizes."""
