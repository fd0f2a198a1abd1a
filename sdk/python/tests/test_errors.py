"""The SDK's exception classes against the one error table in the C
sources (include/rlai/error.h, RLAI_WIRE_CODE_MAP): same codes, same names,
one class per code, so a new wire code cannot be forgotten here."""
import re
from pathlib import Path

import pytest

from rtx_localai import errors

ERROR_H = Path(__file__).resolve().parents[3] / "include" / "rlai" / "error.h"


def wire_table():
    text = ERROR_H.read_text()
    start = text.index("#define RLAI_WIRE_CODE_MAP(X)")
    end = text.index("#define RLAI_ERROR_MAP(X)")
    return {int(code): name for name, code in re.findall(r"X\((\w+), (\d+),", text[start:end])}


@pytest.mark.skipif(not ERROR_H.exists(), reason="not run from a source checkout (no include/rlai/error.h)")
def test_exception_classes_match_the_c_table():
    table = wire_table()
    assert len(table) >= 14
    assert set(errors.ERROR_CLASSES) == set(table)
    for code, cls in errors.ERROR_CLASSES.items():
        assert cls.code == code
        assert cls.name == table[code], f"{cls.__name__}: {cls.name} != {table[code]}"


def test_unknown_code_maps_to_internal_keeping_what_was_sent():
    e = errors.error_from_frame({"code": 999, "name": "NEW_THING", "msg": "m", "id": 3})
    assert isinstance(e, errors.InternalError)
    assert (e.code, e.name, e.request_id) == (999, "NEW_THING", 3)
