"""``launch``'s options explained where users look (:mod:`shmpool.option_docs`): ``help(shmpool.launch)``
has an ``Args:`` entry for every option, with the text of its ``PoolConfig`` field's docstring."""

from __future__ import annotations

import dataclasses
import inspect
import pydoc
import re

import shmpool
from shmpool.config import PoolConfig


def test_help_of_launch_explains_every_option_in_order() -> None:
    text = pydoc.render_doc(shmpool.launch, renderer=pydoc.plaintext)
    args = text[text.index("Args:") : text.index("Examples:")]
    named = re.findall(r"^ {8,12}([a-z_]+): ", args, re.M)
    options = [field.name for field in dataclasses.fields(PoolConfig) if field.init]
    assert named == options == list(inspect.signature(shmpool.launch).parameters)
    flowing = " ".join(args.split())
    for field in ("trainer_slot", "recv_order", "engine"):  # long ones, wrapped over several lines
        source = inspect.getsource(PoolConfig)
        docstring = source.split(f"    {field}:", 1)[1].split('"""')[1]
        assert " ".join(docstring.split()) in flowing, field
