"""The window schedule and the chunk-window retention arithmetic."""
import pytest

import mstar_kv as mk


def test_schedule_commit_spans_tile_the_total_exactly():
    for total, window, overlap in [(21, 3, 0), (21, 5, 2), (7, 8, 3), (1, 1, 0), (100, 9, 4)]:
        s = mk.Schedule(total, window, overlap)
        assert s.stride == window - overlap
        covered = []
        for w in s:
            assert w.end - w.start == window
            assert w.start == w.index * s.stride
            covered.extend(range(w.commit_start, w.commit_end))
        assert covered == list(range(total))
        last = s.window(s.count - 1)
        assert last.pad == max(0, last.end - total)


def test_schedule_window_zero_commits_everything_later_ones_skip_the_overlap():
    s = mk.Schedule(20, 6, 2)
    w0, w1 = s.window(0), s.window(1)
    assert (w0.commit_start, w0.commit_end, w0.cond_start, w0.cond_end) == (0, 6, 0, 0)
    assert (w1.start, w1.commit_start, w1.cond_start, w1.cond_end) == (4, 6, 4, 6)


def test_schedule_rejects_invalid_specs_and_windows_out_of_range():
    for args in [(10, 0, 0), (10, 4, 4), (-1, 4, 0), (10, 4, -1)]:
        with pytest.raises(mk.InvalidSpecError):
            mk.Schedule(*args)
    s = mk.Schedule(10, 4, 0)
    with pytest.raises(mk.OutOfRangeError):
        s.window(s.count)
    assert len(mk.Schedule(0, 4, 0)) == 0


def test_decode_span_gives_left_context_and_the_trim():
    s = mk.Schedule(21, 3, 0)
    d0, d2 = s.decode_span(0, 1), s.decode_span(2, 1)
    assert (d0.in_start, d0.in_end, d0.trim) == (0, 3, 0)
    assert (d2.in_start, d2.in_end, d2.trim) == (5, 9, 1)


def _skipped(chunk, sink, window, n, reset=False):
    """The rule in mstar_kv.h's words: keep the sink and the last window
    chunks' tokens, the skip snapped down to a chunk boundary."""
    after = n - sink * chunk
    if after <= 0:
        return 0
    if reset:
        return after // chunk * chunk
    return max(0, after - window * chunk) // chunk * chunk


def test_skipped_tokens_keeps_sink_and_window_snapped_to_chunks():
    r = mk.Retention(10, sink_chunks=1, window_chunks=2)
    for n in range(0, 120):
        assert r.skipped_tokens(n) == _skipped(10, 1, 2, n), n


def test_skipped_tokens_with_reset_drops_everything_past_the_sink_at_each_boundary():
    r = mk.Retention(8, sink_chunks=2, window_chunks=1, reset_at_boundary=True)
    for n in range(0, 80):
        assert r.skipped_tokens(n) == _skipped(8, 2, 1, n, reset=True), n


def test_a_window_of_zero_chunks_keeps_only_the_sink_as_reset_mode_does():
    zero = mk.Retention(10, sink_chunks=1, window_chunks=0)
    zero.validate(page_size=4)
    reset = mk.Retention(10, sink_chunks=1, window_chunks=0, reset_at_boundary=True)
    for n in range(0, 120):
        assert zero.skipped_tokens(n) == _skipped(10, 1, 0, n) == reset.skipped_tokens(n), n


def test_retention_validate_says_why_a_policy_is_invalid():
    with pytest.raises(mk.InvalidSpecError) as e:
        mk.Retention(0, window_chunks=1).validate()
    assert e.value.detail
    with pytest.raises(mk.InvalidSpecError) as e:   # whole-page visibility of an exact policy needs alignment
        mk.Retention(10, sink_chunks=1, window_chunks=1, exact=True).validate(page_size=16, visibility="pages")
    assert e.value.detail
    mk.Retention(10, sink_chunks=1, window_chunks=1, exact=True).validate(page_size=16)   # exact plans: any size
    mk.Retention(16, sink_chunks=1, window_chunks=1, exact=True).validate(page_size=16, visibility="pages")
    r = mk.Retention(10, 1, 3)
    assert (r.chunk_size, r.sink_chunks, r.window_chunks) == (10, 1, 3)
