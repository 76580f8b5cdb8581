"""builtin:shapes-wan: a small Wan text-to-video model trained on the CPU (docs/shapes-wan.md)."""
