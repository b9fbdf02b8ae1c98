"""migrate/collector.py: the objects there before a run are frozen during it and unfrozen after; a
caller's own freeze is left alone; garbage made during the run is still collected."""
import gc
import weakref

from migrate.collector import older_objects_frozen


class _Node:
    pass


def _cycle():
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_the_older_objects_are_frozen_during_the_run_and_unfrozen_after():
    assert gc.get_freeze_count() == 0
    with older_objects_frozen():
        assert gc.get_freeze_count() > 0
        made_during = _cycle()
        gc.collect()
        assert made_during() is None   # a cycle made inside is still collected
    assert gc.get_freeze_count() == 0


def test_a_callers_own_freeze_is_left_as_it_is():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with older_objects_frozen():
            pass
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
