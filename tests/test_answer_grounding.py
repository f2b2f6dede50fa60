"""Issue 47: answers carry only numbers a cell printed, the last round ends with an answer,
and the model is shown what a CSV really holds (rows, types, missing values, odd headers,
encodings) before its first cell."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

from slackinterp.llm import grounding, hints, prompts
from tests.fakes.openai_server import Reply
from tests.slack_harness import CHANNEL, all_text, bot_messages, wait_cells, wait_final
from tests.test_agent_e2e import model_bot, py


def test_numbers_no_cell_printed_are_found() -> None:
    out = "mean    34.6472\ncount 891\n"
    assert grounding.unprinted("The mean fare is 34.65 over 891 rows.", out, "") == []
    assert grounding.unprinted("@mean_fare[34.65]", out, "") == []
    assert grounding.unprinted("The mean is 35.1 and the median 14.45.", out, "") == [
        "35.1",
        "14.45",
    ]
    # Numbers the person wrote, list markers, code and names are not stated values.
    quoted = "Round to 2 decimal places, ages over 60."
    answer = "1. Ages over 60 rounded to 2 places: 34.65\n2. `df[df.age > 18]` col2"
    assert grounding.unprinted(answer, out, quoted) == []
    assert grounding.unprinted("1,234 rows", "1234\n", "") == []


def test_the_nudge_names_the_numbers_and_is_not_kept() -> None:
    text = hints.unprinted(["35.1", "14.45"], blocks=True)
    assert "35.1, 14.45" in text and "```python block" in text
    assert hints.is_guess(text) and hints.is_guess(hints.GUESSED_NUDGE)


def preview(tmp_path: Path, name: str, body: bytes) -> str:
    (tmp_path / name).write_bytes(body)
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(out):
            exec(prompts.file_preview_code([name]), {})  # what the hidden cell runs
    finally:
        os.chdir(cwd)
    [described] = prompts.describe_previews(out.getvalue())
    return described.text


def test_a_csv_preview_states_rows_types_missing_values_and_odd_headers(tmp_path: Path) -> None:
    body = "id, Age,city\n1,34,Lisboa\n2,,São Paulo\n3,51,\n".encode("latin-1")
    text = preview(tmp_path, "people.csv", body)
    assert "3 rows, 3 columns; read it with pd.read_csv(..., encoding='latin-1')" in text
    assert "' Age' (float64, 1 missing)" in text and re.search(r"city \(\w+, 1 missing\)", text)
    assert "id (int64)" in text and "df.columns.str.strip()" in text

    text = preview(tmp_path, "semi.csv", b"a;b\n1;2\n3;4\n")
    assert "2 rows, 2 columns; read it with pd.read_csv(..., sep=';')" in text
    assert "a (int64), b (int64)" in text

    text = preview(tmp_path, "titled.csv", b"REPORT,,\nx,y,z\n1,2,3\n")
    assert "header is probably on a later line" in text


async def test_an_answer_with_a_number_no_cell_printed_goes_back_once(tmp_path: Path) -> None:
    async with model_bot(tmp_path, model_stream=False) as (slack, model, _bot):
        model.script(py("print(6 * 7)"), Reply(text="It is 43."), Reply(text="It is 42."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "It is 42.")
        await wait_cells(slack, ts, 1)
        told = json.dumps(model.requests[2].body["messages"])
        assert "Your answer states 43, which no cell printed" in told
        assert "It is 43." not in told  # a guess is not kept
        assert not any("It is 43." in all_text(m) for m in bot_messages(slack, ts))


async def test_the_last_round_asks_for_the_answer_and_keeps_it(tmp_path: Path) -> None:
    """An answer in the last round is given, never swapped for "I stopped after N rounds",
    and that round is told it is the last."""
    async with model_bot(tmp_path, model_stream=False, max_rounds=2) as (slack, model, _bot):
        model.script(py("print(6 * 7)"), Reply(text="It is 42."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "It is 42.")
        first, last = (json.dumps(r.body["messages"]) for r in model.requests[:2])
        assert json.dumps(hints.LAST_ROUND)[1:-1] in last and hints.LAST_ROUND[:40] not in first
        assert hints.LAST_ROUND[:40] in model.requests[1].body["messages"][-1]["content"]
        assert not any("rounds of code" in all_text(m) for m in bot_messages(slack, ts))


async def test_code_that_already_ran_is_answered_from_its_output(tmp_path: Path) -> None:
    """The model sends the cell that printed the result again: the next reply is asked for
    the answer (no code run), and its words are the answer; the cell ran once."""
    async with model_bot(tmp_path, model_stream=False) as (slack, model, _bot):
        model.script(
            py("print(6 * 7)"),
            py("print(6 * 7)"),
            Reply(text="It is 42.\n```python\nprint(6 * 7 + 1)\n```"),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        final = await wait_final(slack, ts, "It is 42.")
        assert "print(6 * 7 + 1)" not in final["text"]  # its code is neither run nor shown
        # The answer ends with the output it rests on (the model's words may have lost it).
        assert "It is 42.\n\nThe last cell's output ends with:\n```\n42\n```" in final["text"]
        assert len(await wait_cells(slack, ts, 1)) == 1
        asked = json.dumps(model.requests[2].body["messages"][-1])
        assert json.dumps(hints.ANSWER_NOW)[1:-1] in asked
        assert "already ran successfully in this turn. Its output was:\\n42" in asked
        assert hints.ANSWER_NOW[:30] not in json.dumps(model.requests[1].body["messages"])
        # Cells post before the turn's final answer: none came from the answer's code.
        assert len([m for m in bot_messages(slack, ts) if m["text"].startswith("Cell:")]) == 1


async def test_code_again_instead_of_the_answer_ends_with_the_output(tmp_path: Path) -> None:
    async with model_bot(tmp_path, model_stream=False) as (slack, model, _bot):
        model.script(py("print(6 * 7)"), py("print(6 * 7)"), py("print(6 * 8)"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        final = await wait_final(slack, ts, "kept asking to run code that had already run")
        assert "42" in final["text"] and len(model.requests) == 3
        assert len(await wait_cells(slack, ts, 1)) == 1  # print(6 * 8) was not run


async def test_the_last_round_after_a_result_runs_no_code(tmp_path: Path) -> None:
    async with model_bot(tmp_path, model_stream=False, max_rounds=2) as (slack, model, _bot):
        model.script(py("print(6 * 7)"), py("print(6 * 8)"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        final = await wait_final(slack, ts, "in the last one the model sent more code")
        assert "42" in final["text"] and "not run" in final["text"]
        assert len(await wait_cells(slack, ts, 1)) == 1
        last = json.dumps(model.requests[1].body["messages"][-1])
        assert json.dumps(hints.LAST_ROUND_NO_CODE)[1:-1] in last


async def test_the_last_round_after_failures_only_still_runs_a_fix(tmp_path: Path) -> None:
    async with model_bot(tmp_path, model_stream=False, max_rounds=2) as (slack, model, _bot):
        model.script(py("1 / 0"), py("print(6 * 7)"))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        final = await wait_final(slack, ts, "rounds of code")
        cells = await wait_cells(slack, ts, 2)
        assert "42" in all_text(cells[1]) and "ZeroDivisionError" in all_text(cells[0])
        assert "SLACKINTERP_MAX_ROUNDS" in final["text"]
        last = json.dumps(model.requests[1].body["messages"][-1])
        assert json.dumps(hints.LAST_ROUND_CODE)[1:-1] in last


def test_a_cell_that_only_prints_numbers_written_into_it_computes_nothing() -> None:
    written = grounding.prints_only_written_numbers
    assert written("print(0.94)")
    assert written('print("@prediction_accuracy[0.94]")')
    assert written("print(f'@acc[{0.94}]')\n42")
    assert not written('print("done")')  # no number
    assert not written("print(acc)") and not written("print(round(0.945, 2))")
    assert not written("x = 0.94\nprint(x)") and not written("print(0.94")


async def test_such_a_cell_is_not_run_and_the_model_is_told(tmp_path: Path) -> None:
    async with model_bot(tmp_path, model_stream=False) as (slack, model, _bot):
        model.script(py("print(0.94)"), py("print(6 * 7)"), Reply(text="It is 42."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        await wait_final(slack, ts, "It is 42.")
        [cell] = await wait_cells(slack, ts, 1)
        assert "42" in all_text(cell)
        told = json.dumps(model.requests[1].body["messages"])
        assert "only prints values written into it" in told
        assert any(
            "only prints numbers typed into it" in all_text(m) for m in bot_messages(slack, ts)
        )


async def test_an_answer_that_still_states_unprinted_numbers_is_not_passed_on(
    tmp_path: Path,
) -> None:
    """Asked once to compute them, the model gives its numbers again: the thread gets what
    the cells printed and why, not the model's numbers."""
    async with model_bot(tmp_path, model_stream=False) as (slack, model, _bot):
        model.script(py("print(6 * 7)"), Reply(text="It is 43."), Reply(text="Surely 43."))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        final = await wait_final(slack, ts, grounding.WITHHELD[:40])
        assert "42" in final["text"] and "43" not in final["text"]
        assert not any("43" in all_text(m) for m in bot_messages(slack, ts))


async def test_a_guess_given_again_without_any_cell_is_not_passed_on(tmp_path: Path) -> None:
    """Blocks mode: numbers about an attached file, given three times without running code
    (sent back to compute twice)."""
    async with model_bot(tmp_path, model_stream=False, tool_mode="blocks") as (slack, model, _):
        csv = slack.add_user_file("a.csv", b"x\n1\n2\n", "text/csv", "csv")
        model.script(*[Reply(text=f"The mean is {n}.") for n in (7, 8, 9)])
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> mean of x?", files=[csv])
        final = await wait_final(slack, ts, grounding.NO_CELL)
        assert len(model.requests) == 3
        assert (
            "first write the ```python block that computes it from a.csv"
            in (model.requests[2].body["messages"][-1]["content"])
        )
        assert "The mean is 7" not in final["text"] and grounding.WITHHELD[:30] in final["text"]
        # A small model is shown the table's columns, not rows to copy values from.
        asked = model.requests[0].body["messages"][-1]["content"]
        assert "columns: x (int64)" in asked and "first lines" not in asked


async def test_a_reply_cut_with_nothing_after_a_cell_ends_with_that_cell_output(
    tmp_path: Path,
) -> None:
    async with model_bot(tmp_path, model_stream=False, model_reply_seconds=2) as (
        slack,
        model,
        _bot,
    ):
        model.script(py("print(6 * 7)"), Reply(text="It is 42.", delay=8))
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> six times seven")
        final = await wait_final(slack, ts, "The model wrote no answer after the cells above")
        assert "42" in final["text"]
        assert any(
            "SLACKINTERP_MODEL_REPLY_SECONDS" in all_text(m) for m in bot_messages(slack, ts)
        )


def test_an_f_string_with_the_same_quotes_inside_gets_a_hint() -> None:
    """Python 3.11 kernels: a small model's f"{df["col"]}" fails, and it sends it again."""
    hint = hints.for_error("SyntaxError", "f-string: unmatched '['", [])
    assert "other kind of quotes" in hint
    assert hints.for_error("SyntaxError", "invalid syntax", []) == ""


def test_a_name_imported_from_the_wrong_module_is_looked_up() -> None:
    evalue = "cannot import name 'LinearRegression' from 'sklearn.model_selection' (/x/y.py)"
    assert hints.import_from("ImportError", evalue) == (
        "LinearRegression",
        "sklearn.model_selection",
    )
    assert hints.import_from("ModuleNotFoundError", "No module named 'x'") is None
    found = hints.found_in(
        "LinearRegression", "sklearn.model_selection", '["sklearn.linear_model"]'
    )
    assert "from sklearn.linear_model import LinearRegression" in found
    assert hints.found_in("X", "m", "[]") == "" and hints.found_in("X", "m", "oops") == ""


async def test_the_kernel_says_where_a_misplaced_name_is(tmp_path: Path) -> None:
    """Small models import names from the wrong module (`from sklearn.model_selection import
    LinearRegression`) and send the same import again: the error comes with the right one,
    found among the kernel's own packages."""
    async with model_bot(tmp_path, model_stream=False) as (slack, model, _bot):
        model.script(
            py("from json.decoder import dumps"),
            py("from email.message import message_from_string"),
            Reply(text="Done."),
        )
        ts, _ = await slack.user_message(CHANNEL, "<@UBOT> import things")
        await wait_final(slack, ts, "Done.")
        told = [m for m in model.requests[1].body["messages"] if m["role"] == "tool"]
        assert "it is in json: `from json import dumps`" in told[-1]["content"]
        told = [m for m in model.requests[2].body["messages"] if m["role"] == "tool"]
        assert "`from email import message_from_string`" in told[-1]["content"]
        assert not any("__slackinterp_where" in all_text(m) for m in bot_messages(slack, ts))
