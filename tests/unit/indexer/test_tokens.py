from indexer.tokens import code_tokens, split_identifier


def test_snake_and_camel_split_keep_whole_identifier():
    assert code_tokens("getHTTPResponse(max_len)") == [
        "gethttpresponse", "get", "http", "response", "max_len", "max", "len",
    ]


def test_simple_words_are_not_duplicated():
    assert code_tokens("def foo(x): return x") == ["def", "foo", "x", "return", "x"]


def test_split_identifier_cases():
    assert split_identifier("XMLHttpRequest") == ["xml", "http", "request"]
    assert split_identifier("__init__") == ["init"]
    assert split_identifier("parse2Ints") == ["parse", "2", "ints"]
    assert split_identifier("CONSTANT_VALUE") == ["constant", "value"]


def test_query_and_index_share_tokenizer():
    from indexer.bm25 import chunk_tokens

    assert chunk_tokens("readFile") == "readfile read file"
