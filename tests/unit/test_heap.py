"""run/rank/heap.py leaves malloc alone where the user set their own MALLOC_* variables."""
from __future__ import annotations

import pytest

from gpusession.run.rank.heap import USER_SETTINGS, keep_freed_memory


@pytest.mark.parametrize("name", USER_SETTINGS)
def test_a_users_own_malloc_setting_is_left_alone(name):
    assert keep_freed_memory({name: "131072"}) is False
