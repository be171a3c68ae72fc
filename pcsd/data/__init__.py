"""The real data and models, fetched and checked: ``python -m pcsd.data`` / ``pcsd-data``.

One module per source: :mod:`pcsd.data.alfworld` (ALFWorld's games), :mod:`pcsd.data.webshop`
(WebShop's catalogue and the reward's noun table), :mod:`pcsd.data.model` (a Hugging Face model
into a folder); :mod:`pcsd.data.fetch` holds what they share (manifests, mirrors, resumable
downloads, the one-line :class:`DataError`). ``docs/data.md`` describes the sources and layouts.
"""

from pcsd.data.fetch import DataError

__all__ = ["DataError"]
