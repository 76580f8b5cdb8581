"""`python -m settings`: rewrite docs/configuration.md and .env.example from settings/table.py."""

from settings.files import write

for path in write():
    print(f"wrote {path}")
