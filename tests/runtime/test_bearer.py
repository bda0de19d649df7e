from kvmesh.runtime.bearer import bearer_token, matching_key


def test_bearer_token_reads_only_bearer_headers():
    assert bearer_token("Bearer abc ") == "abc"
    assert bearer_token("bearer abc") == "abc"
    assert bearer_token("Basic abc") == ""
    assert bearer_token(None) == ""
    assert bearer_token("Bearer") == ""


def test_matching_key_names_the_equal_key_or_none():
    assert matching_key("b", ["a", "b"]) == "b"
    assert matching_key("c", ["a", "b"]) is None
    assert matching_key("", ["a"]) is None
