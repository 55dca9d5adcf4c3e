"""The operator's dashboard: server-rendered pages under /ui (see routes.py)."""
