from hypothesis import given
from hypothesis import strategies as st

from inference.engine.textstream import StopMatcher


def feed_all(stops, pieces):
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces)
    if not m.stopped:
        out += m.flush()
    return out, m.stopped


def test_no_stops_passes_text_through():
    assert feed_all([], ["ab", "cd"]) == ("abcd", False)


def test_stop_spanning_pieces_is_cut_and_never_emitted():
    m = StopMatcher(["###"])
    assert m.feed("hello #") == "hello "
    assert m.feed("#") == ""
    assert m.feed("# tail") == ""
    assert m.stopped


def test_false_alarm_is_released():
    assert feed_all(["\n\n"], ["a\n", "b"]) == ("a\nb", False)


def test_earliest_of_several_stops_wins():
    assert feed_all(["END", "x"], ["abxcdEND"]) == ("ab", True)


@given(st.lists(st.text(max_size=6), max_size=8), st.lists(st.text(min_size=1, max_size=4), max_size=3))
def test_streamed_equals_whole_text_cut_at_first_stop(pieces, stops):
    whole = "".join(pieces)
    hits = [whole.find(s) for s in stops if whole.find(s) >= 0]
    expected = whole[: min(hits)] if hits else whole
    assert feed_all(stops, pieces) == (expected, bool(hits))
