"""The run's page (``python -m pcsd.view RUN [RUN_B]``): the episode records of a run, one static
HTML file that opens from the file system (:mod:`pcsd.view.page`; docs/view.md)."""

from pcsd.view.page import ViewError, build_page, load_run, write_run_page

__all__ = ["ViewError", "build_page", "load_run", "write_run_page"]
