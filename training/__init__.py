"""Training scripts for the trained built-in models (run by hand; the engine never imports them)."""
