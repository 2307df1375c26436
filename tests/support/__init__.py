"""Helpers the tests share: the in-process notebook harness, fresh student environments, a throw-away PostgreSQL server, the browser's JupyterLab."""
