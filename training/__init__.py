"""How the built-ins' shipped files are made (run by hand; nothing that serves imports this package): the
trained models' training scripts (`shapes/`, `shapes_dit/`) and the generators of the tiny tokenizers
(`tokenizers/`), whose output lives in batching/assets/."""
