"""The driver hands the memory its passes over the records freed back to the system (search.campaign.heap)."""

def test_the_freed_heap_is_handed_back_at_most_every_interval(monkeypatch):
    from qkvsearch.search.campaign import heap

    monkeypatch.setattr(heap, "_last", 0.0)
    assert heap.release_freed() is (heap._malloc_trim() is not None)   # glibc's malloc_trim, where there is one
    assert heap.release_freed() is False   # within MIN_INTERVAL_S of the last
