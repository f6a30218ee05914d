"""The programs under test set process-wide torch switches (deterministic algorithms, one
thread): put them back so tests elsewhere in this process see the defaults."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def torch_defaults() -> Iterator[None]:
    try:
        import torch
    except ImportError:
        yield
        return
    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(strict)
    torch.set_num_threads(threads)
