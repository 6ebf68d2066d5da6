"""The subscription trie and the retained tree against the naive matcher."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tbmq.broker.retained import RetainedTree
from tbmq.broker.trie import SubscriptionTrie
from tbmq.model import Message
from tbmq.mqtt.topics import topic_matches

LEVELS = st.sampled_from(["a", "b", "c", "", "$SYS", "$x"])
NAMES = st.lists(LEVELS, min_size=1, max_size=4).map("/".join)


@st.composite
def filters(draw):
    levels = draw(st.lists(st.sampled_from(["a", "b", "c", "", "+", "$SYS"]), min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


@settings(max_examples=300, deadline=None)
@given(st.lists(filters(), max_size=12), NAMES)
def test_trie_matches_like_the_naive_matcher(topic_filters, name):
    trie = SubscriptionTrie()
    for i, f in enumerate(topic_filters):
        trie.add(f, (f, i), i)
    got = sorted(v for subs in trie.match(name) for v in subs.values())
    want = sorted(i for i, f in enumerate(topic_filters) if topic_matches(f, name))
    assert got == want


@settings(max_examples=200, deadline=None)
@given(st.lists(filters(), max_size=10), st.data())
def test_trie_remove_prunes_and_keeps_the_rest(topic_filters, data):
    trie = SubscriptionTrie()
    for i, f in enumerate(topic_filters):
        trie.add(f, i, i)
    removed = set(data.draw(st.sets(st.integers(0, max(0, len(topic_filters) - 1)))))
    for i in removed:
        if i < len(topic_filters):
            assert trie.remove(topic_filters[i], i) == i
    kept = {i for i in range(len(topic_filters)) if i not in removed}
    assert sorted(k for _, k, _ in trie.items()) == sorted(kept)
    assert len(trie) == len(kept)
    if not kept:
        assert trie._root.children == {}


@settings(max_examples=300, deadline=None)
@given(st.lists(NAMES, max_size=12, unique=True), filters())
def test_retained_tree_matches_like_the_naive_matcher(names, topic_filter):
    tree = RetainedTree()
    for name in names:
        tree.set(Message(name, b"x"))
    got = sorted(m.topic for m in tree.match(topic_filter))
    want = sorted(n for n in names if topic_matches(topic_filter, n))
    assert got == want


def test_spec_examples():
    trie = SubscriptionTrie()
    for f in ["sport/tennis/player1/#", "sport/+", "+/+", "/finance", "#", "+/monitor/Clients", "$SYS/#"]:
        trie.add(f, f, f)

    def matched(name):
        return sorted(v for subs in trie.match(name) for v in subs.values())

    assert matched("sport/tennis/player1") == ["#", "sport/tennis/player1/#"]
    assert matched("sport") == ["#"]
    assert matched("sport/") == ["#", "+/+", "sport/+"]
    assert matched("/finance") == ["#", "+/+", "/finance"]
    assert matched("$SYS/monitor/Clients") == ["$SYS/#"]  # [MQTT-4.7.2-1]
    assert trie.add("sport/+", "sport/+", 2) is False
    assert trie.get("sport/+", "sport/+") == 2
    assert trie.remove("sport/+", "nobody") is None


def test_retained_remove_prunes():
    tree = RetainedTree()
    tree.set(Message("a/b/c", b"1"))
    tree.set(Message("a", b"2"))
    assert len(tree) == 2
    assert tree.remove("a/b/c").payload == b"1"
    assert tree.remove("a/b/c") is None
    assert tree._root.children["a"].children == {}
    assert [m.topic for m in tree.match("a/#")] == ["a"]


def test_the_match_cache_follows_changes():
    trie = SubscriptionTrie()
    assert trie.match("a/b") == []
    trie.add("a/+", "c1", 1)
    assert [dict(d) for d in trie.match("a/b")] == [{"c1": 1}]
    trie.add("a/b", "c2", 2)
    assert sorted(v for d in trie.match("a/b") for v in d.values()) == [1, 2]
    trie.remove("a/+", "c1")
    assert [dict(d) for d in trie.match("a/b")] == [{"c2": 2}]
    trie.remove("a/b", "c2")
    assert trie.match("a/b") == []
