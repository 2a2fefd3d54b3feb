"""Deprecated: ``shmpool.env_families`` under its old name, which goes in the next release."""

from __future__ import annotations

from .env_families import *  # noqa: F403
from .env_families import __all__  # noqa: F401
from .errors import renamed_module

renamed_module(__name__, "shmpool.env_families")
