"""bench/answers.py scores with InfiAgent-DABench's own rule (bench/dabench_score.py): every
`@name[value]` read by its regex, text equal or floats within 1e-6, all sub-answers right;
and it names the kind of each miss."""

from __future__ import annotations

from bench.dabench_score import Miss, parsed, same, score

LABELS = [("mean_fare", "34.65"), ("sex", "male")]
CELLS = "mean 34.6472\nmost common: male\n"


def check(answer: str, cells: str = CELLS, **kwargs: bool) -> tuple[bool, Miss | None]:
    result = score(answer, LABELS, cell_text=cells, quoted="round to 2 places", **kwargs)
    return result.right, result.miss


def test_the_rule() -> None:
    assert parsed("@a[1] then @b[ x ] and @a[2]") == {"a": "2", "b": "x"}  # a later one wins
    assert same("34.650000", "34.65") and same("male", "male")
    assert not same("34.66", "34.65") and not same("Male", "male")
    assert check("@mean_fare[34.65], @sex[male]") == (True, None)


def test_the_kinds_of_miss() -> None:
    assert check("@mean_fare[34.65]") == (False, Miss.FORMAT)  # a sub-answer missing
    assert check("mean fare 34.65, sex male") == (False, Miss.FORMAT)
    assert check("@mean_fare[35.12], @sex[male]") == (False, Miss.UNPRINTED)
    assert check("@mean_fare[34.6], @sex[male]", "mean 34.6\n") == (False, Miss.WRONG)
    assert check("") == (False, Miss.NO_ANSWER)
    assert check("I stopped: …", gave_up=True) == (False, Miss.NO_ANSWER)
    quoted = "I stopped … Its output ends with: @mean_fare[34.6], @sex[male]"
    assert check(quoted, "mean 34.6\n", gave_up=True) == (False, Miss.WRONG)
    assert check("", timed_out=True) == (False, Miss.TIME)


def test_numbers_no_cell_printed_are_listed_for_right_answers_too() -> None:
    answer = "@mean_fare[34.65], @sex[male] from 891 rows"
    result = score(answer, LABELS, cell_text=CELLS, quoted="")
    assert result.right and result.unprinted == ["891"]
