"""The full-text normaliser, without a database: the same words as the slow oracle, for any text."""

from __future__ import annotations

import unicodedata

from fts_oracle import oracle_terms, oracle_words
from hypothesis import given
from hypothesis import strategies as st

from memorm.search.normalize import MAX_INDEX_BYTES, MAX_WORD_CHARS, index_words, words
from memorm.search.terms import fts5_query, query_terms, tsquery
from memorm.types.search_words import decode_tsvector, encode_tsvector

EVERY_CHARACTER = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))


def test_every_character_is_split_and_folded_as_the_oracle_says() -> None:
    alone = " ".join(EVERY_CHARACTER)
    assert words(alone) == oracle_words(alone)
    marks = " ".join(f"a{c}" for c in EVERY_CHARACTER if unicodedata.category(c)[0] == "M")
    assert len(marks) > 6_000
    assert words(marks) == oracle_words(marks)  # every combining mark stays in its word


@given(text=TEXT)
def test_words_agree_with_the_oracle(text: str) -> None:
    assert words(text) == oracle_words(text)


@given(text=st.text(st.characters(max_codepoint=127, exclude_characters="\x00")))
def test_ascii_text_takes_the_fast_path_to_the_same_words(text: str) -> None:
    assert words(text) == oracle_words(text)
    assert index_words(text) == sorted({word.encode() for word in oracle_words(text)})


@given(text=TEXT)
def test_normalising_words_again_changes_nothing(text: str) -> None:
    # A word copied out of the index (or a result) and searched for is the same word.
    found = words(text)
    assert words(" ".join(found)) == found
    for word in found:
        assert words(word) == [word]


@given(text=TEXT)
def test_the_index_holds_each_distinct_word_once_in_byte_order(text: str) -> None:
    stored = index_words(text)
    assert stored == sorted({word.encode() for word in oracle_words(text)})
    assert decode_tsvector(encode_tsvector(stored)) == " ".join(word.decode() for word in stored)


def test_long_words_keep_their_first_255_characters() -> None:
    assert MAX_WORD_CHARS == 255
    assert words("a" * 300 + " b") == ["a" * 255, "b"]
    assert words("é" * 300) == ["é" * 255]
    assert index_words("x" * 1000 + " " + "x" * 900) == [b"x" * 255]


@given(query=st.lists(st.one_of(TEXT, st.sampled_from(["'", '"', "\\", "&", "|", "!", ":*", "(", ")"]))))
def test_query_terms_carry_no_syntax_of_either_engine(query: list[str]) -> None:
    text = " ".join(query)
    terms = query_terms(text)
    assert terms == oracle_terms(text)
    for term in terms:  # letters, digits and marks only: nothing either parser could read as syntax
        assert not set(term) & set("'\"\\&|!:*()<>- \t\n")
    assert fts5_query(terms) == " ".join(f'"{term}"' for term in terms)
    assert tsquery(terms) == " & ".join(f"'{term}'" for term in terms)


def test_distinct_words_are_indexed_up_to_a_tsvectors_size_in_order_of_appearance() -> None:
    repeated = "same words again " * 200_000  # 3.4 MB of text, 15 bytes of distinct words
    assert index_words(repeated) == [b"again", b"same", b"words"]
    exact = "z" * (MAX_INDEX_BYTES % 7) + " " + " ".join(f"{n:07d}" for n in range(MAX_INDEX_BYTES // 7))
    assert sum(map(len, index_words(exact))) == MAX_INDEX_BYTES  # all of them
    over = exact + " y 9999999"
    assert index_words(over) == index_words(exact)  # the words after the limit are left out
    shuffled = " ".join(f"ж{n:06d}" for n in reversed(range(150_000)))  # 1,350,000 bytes
    kept = index_words(shuffled)
    assert kept == sorted(f"ж{n:06d}".encode() for n in range(150_000 - len(kept), 150_000))
    assert MAX_INDEX_BYTES - 9 < sum(map(len, kept)) <= MAX_INDEX_BYTES
