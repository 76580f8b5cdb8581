"""The built-in models' folders: real pipelines of each supported family with seeded random weights.

Each is built from configs (no download), saved once with `save_pretrained` under the cache
folder keyed by its version, and from then on loaded with
`from_pretrained(local_files_only=True)`, exactly like a real checkpoint. `core.builtin_models`
names them; `folders` locates and builds them; each family's builder module builds its own
(imported only when a build is needed, so naming and locating a built-in stays torch-free);
`components` holds the parts several builders share.
"""
