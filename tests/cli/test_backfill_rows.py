"""Reading backfill input files and deriving each row's idempotency key (no API needed)."""

from __future__ import annotations

from stepwise_cli.backfill import Row, idempotency_key, read_rows


def test_jsonl_rows_keep_their_line_numbers_and_bad_lines_are_reported(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "a fox"}\n\n{not json\n["a list"]\n{"prompt": "a cat", "seed": 3}\n')
    rows = read_rows(path)
    assert [row.line for row in rows] == [1, 3, 4, 5]
    assert rows[0].body == {"prompt": "a fox"}
    assert rows[1].body is None and "not valid JSON" in rows[1].parse_error
    assert rows[2].body is None and "JSON object" in rows[2].parse_error
    assert rows[3].body == {"prompt": "a cat", "seed": 3}


def test_csv_numeric_columns_are_coerced_and_empty_cells_left_out(tmp_path):
    path = tmp_path / "prompts.csv"
    path.write_text(
        "prompt,seed,guidance_scale,height,negative_prompt\n"
        '"a fox, running",7,7.5,64,\n'
        "a cat,seven,7.5,64,blurry\n"
        "a dog,,1,128,blurry\n"
    )
    rows = read_rows(path)
    assert [row.line for row in rows] == [2, 3, 4]
    assert rows[0].body == {"prompt": "a fox, running", "seed": 7, "guidance_scale": 7.5, "height": 64}
    assert rows[1].body is None and "seed must be an integer" in rows[1].parse_error
    assert rows[2].body == {"prompt": "a dog", "guidance_scale": 1.0, "height": 128, "negative_prompt": "blurry"}


def test_a_csv_row_with_too_many_cells_is_reported(tmp_path):
    path = tmp_path / "prompts.csv"
    path.write_text("prompt,seed\na fox,1,extra\n")
    (row,) = read_rows(path)
    assert row.line == 2 and row.body is None and "more cells" in row.parse_error


def test_idempotency_keys_depend_on_run_name_line_and_content_but_not_key_order():
    row = Row(3, {"prompt": "a fox", "seed": 1})
    same = Row(3, {"seed": 1, "prompt": "a fox"})
    assert idempotency_key("prompts.jsonl", row) == idempotency_key("prompts.jsonl", same)
    assert idempotency_key("prompts.jsonl", row) != idempotency_key("other.jsonl", row)
    assert idempotency_key("prompts.jsonl", row) != idempotency_key("prompts.jsonl", Row(4, row.body))
    other_body = Row(3, {"prompt": "a fox", "seed": 2})
    assert idempotency_key("prompts.jsonl", row) != idempotency_key("prompts.jsonl", other_body)
    assert len(idempotency_key("prompts.jsonl", row)) <= 255
