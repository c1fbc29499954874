"""The application service layer: one function per use case (run, recover, rescale, status, validate, report).

The CLI and the Airflow tasks both call :mod:`splitkeeper.app.services`; results are the typed
dataclasses of :mod:`splitkeeper.app.results`.
"""
