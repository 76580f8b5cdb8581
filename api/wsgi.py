"""The WSGI app `stepwise api` serves (through the granian bridge, stepwise_cli.api_rsgi)."""

from api import create_app

app = create_app()
