"""The trainer's side of a pool: ``launch`` and the ``Pool`` it returns, with the rooms it is built
from (see ``shmpool.pool.pool``)."""

from .pool import Pool, launch

__all__ = ["Pool", "launch"]
