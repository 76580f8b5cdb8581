"""The WSGI entry point: `gunicorn 'api.wsgi:app'` (what `stepwise api` serves)."""

from api import create_app

app = create_app()
