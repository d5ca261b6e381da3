"""Which path `chpart_spark.write()` takes (`choose_path`), as a scenario table: what the call
asks for (`via`, the Python-only test hook, the connector-only `layout`) against whether the
connector's jar is loadable. Nothing may be dropped silently: a call that asks for what the
chosen path cannot honour is refused before anything runs. No Spark session is needed: whether
the jar is loadable is the one thing taken from the session, and it is set here."""

import pytest

import chpart_spark
from chpart_spark import writer


def hook(task_context, manifest):  # stands in for a test hook; never run here
    raise AssertionError("not run")


# (via, _after_build, layout, jar loadable, path taken or the refusal's words)
CASES = [
    ("auto", None, None, True, "connector"),
    ("auto", None, None, False, "python"),
    ("auto", hook, None, True, "python"),
    ("auto", None, "none", True, "connector"),
    ("auto", None, "table", True, "connector"),
    ("auto", None, "none", False, "layout='none' (the connector's option): chpart.spark.ChpartDataSource is not loadable"),
    ("auto", hook, "none", True, "no path honours both"),
    ("connector", None, None, True, "connector"),
    ("connector", None, "none", True, "connector"),
    ("connector", None, None, False, 'via="connector": chpart.spark.ChpartDataSource is not loadable'),
    ("connector", hook, None, True, 'via="connector" cannot honour _after_build'),
    ("python", None, None, True, "python"),
    ("python", hook, None, False, "python"),
    ("python", None, "none", True, 'via="python" cannot honour layout=\'none\''),
    ("python", None, "table", False, 'via="python" cannot honour layout=\'table\''),
]


@pytest.mark.parametrize("via, after_build, layout, loadable, expected", CASES)
def test_the_path_honours_everything_the_call_asks_for_or_refuses(monkeypatch, via, after_build, layout, loadable,
                                                                   expected):
    monkeypatch.setattr(writer, "connector_loaded", lambda spark: loadable)
    if expected in ("connector", "python"):
        path, why = writer.choose_path(via, None, after_build=after_build, layout=layout)
        assert path == expected, why
        assert why
    else:
        with pytest.raises(ValueError) as refused:
            writer.choose_path(via, None, after_build=after_build, layout=layout)
        assert expected in str(refused.value), str(refused.value)


@pytest.mark.parametrize("via, loadable, expected", [
    ("auto", True, "connector"),
    ("connector", True, "connector"),
    ("auto", False, "target_part_bytes=1000 (the connector's option): chpart.spark.ChpartDataSource is not loadable"),
    ("python", True, 'via="python" cannot honour target_part_bytes=1000'),
])
def test_target_part_bytes_needs_the_connector(monkeypatch, via, loadable, expected):
    monkeypatch.setattr(writer, "connector_loaded", lambda spark: loadable)
    if expected == "connector":
        assert writer.choose_path(via, None, target_part_bytes=1000)[0] == expected
    else:
        with pytest.raises(ValueError) as refused:
            writer.choose_path(via, None, target_part_bytes=1000)
        assert expected in str(refused.value), str(refused.value)


@pytest.mark.parametrize("value", [0, -5, "1GB", 1.5, True])
def test_write_refuses_a_target_part_bytes_that_is_not_a_positive_int(value):
    with pytest.raises(ValueError, match="target_part_bytes must be a positive int"):
        chpart_spark.write(None, table="db.t", load_id="l", config="/nonexistent.toml", target_part_bytes=value)


def test_write_refuses_an_unknown_layout_before_anything_runs():
    # Checked before the DataFrame is touched: None stands in for it.
    with pytest.raises(ValueError, match="layout must be one of table, none; got 'clustered'"):
        chpart_spark.write(None, table="db.t", load_id="l", config="/nonexistent.toml", layout="clustered")
