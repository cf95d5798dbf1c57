"""``bench/report.py`` and the result files: the README's results table and the tables of
docs/benchmarks.md are the current output of the script, every result file is shown, every
file names its machine, and the files are named by benchmark and CPU family."""

import json
import os

import pytest
from paths import ROOT, load_bench

RESULTS = ROOT / "bench" / "results"


def test_the_pages_hold_the_current_tables_of_every_result_file(capsys):
    report = load_bench("report")
    status = report.main(["--check"])
    assert status == 0, capsys.readouterr().err


def test_every_result_file_is_named_by_its_cpu_family_and_its_table_names_its_machine():
    common = load_bench("common")
    stems = sorted(p.name[:-5] for p in RESULTS.glob("*.json"))
    assert stems
    assert sorted(p.name[:-3] for p in RESULTS.glob("*.md")) == stems
    for stem in stems:
        payload = json.loads((RESULTS / f"{stem}.json").read_text())
        machine = payload["machine"]
        name, family = stem.split(".")
        assert family == common.cpu_family(machine), stem
        if family != "unrecorded":  # the files written before the records
            for key in ("cpu", "cpu_flags", "cores", "torch_threads", "date", "command"):
                assert machine.get(key), (stem, key)
        table = (RESULTS / f"{stem}.md").read_text().rstrip("\n")
        assert table.splitlines()[-1] == common.describe(machine, payload.get("commands")), stem


@pytest.mark.parametrize("cpu, flags, family", [
    ("Intel(R) Xeon(R) Platinum 8481C", ["avx2", "avx512f", "avx512_bf16", "amx_bf16"],
     "xeon-amx"),
    ("AMD EPYC 9R14", ["avx2", "avx512f", "avx512_vnni", "avx512_bf16"], "epyc-avx512bf16"),
    ("Intel(R) Xeon(R) CPU @ 2.50GHz", ["avx2", "avx512f", "avx512_vnni"], "xeon-avx512vnni"),
    ("Intel(R) Xeon(R) CPU @ 2.20GHz", ["avx2", "fma"], "xeon-avx2"),
    ("x86_64", [], "unrecorded"),
])
def test_a_cpu_family_is_the_line_and_the_widest_vector_feature(cpu, flags, family):
    common = load_bench("common")
    assert common.cpu_family({"cpu": cpu, "cpu_flags": flags}) == family


def test_a_result_name_is_a_plain_name(tmp_path, monkeypatch):
    common = load_bench("common")
    monkeypatch.setattr(common, "RESULTS", str(tmp_path))
    machine = {"cpu": "AMD EPYC", "cpu_flags": ["avx2"], "cores": 2, "date": "2026-11-28",
               "command": "python bench/x.py"}
    assert common.result_stem("decode", machine) == os.path.join(tmp_path, "decode.epyc-avx2")
    for bad in ("", "../x", "decode.amx", ".hidden"):
        with pytest.raises(SystemExit, match="plain file name"):
            common.result_stem(bad, machine)
    common.write_results("decode", {"machine": machine, "rows": [1]}, "| a |\n|---|")
    assert json.loads((tmp_path / "decode.epyc-avx2.json").read_text())["rows"] == [1]
    assert (tmp_path / "decode.epyc-avx2.md").read_text().endswith(
        "2026-11-28: `python bench/x.py`.\n")


def test_table_blocks_take_the_result_file_and_stale_pages_are_named(tmp_path, monkeypatch):
    report = load_bench("report")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.epyc-avx2.md").write_text("| a |\n|---|\n| 1 |\n")
    (tmp_path / "results" / "x.epyc-avx2.json").write_text("{}")
    monkeypatch.setattr(report, "RESULTS", str(tmp_path / "results"))
    page = "intro\n<!-- table: x.epyc-avx2 -->\n| a |\n| 0 |\n<!-- end generated -->\nafter\n"
    assert report.replace_tables(page) == (
        "intro\n<!-- table: x.epyc-avx2 -->\n| a |\n|---|\n| 1 |\n<!-- end generated -->\nafter\n")
    with pytest.raises(SystemExit, match="missing"):
        report.replace_tables("<!-- table: gone.xeon-amx -->\n<!-- end generated -->")
    benchmarks = tmp_path / "benchmarks.md"
    benchmarks.write_text(page)
    monkeypatch.setattr(report, "BENCHMARKS", str(benchmarks))
    monkeypatch.setattr(report, "README", str(tmp_path / "README.md"))
    (tmp_path / "README.md").write_text(f"{report.README_START}\nold\n{report.END}\n")
    monkeypatch.setattr(report, "ROWS", [lambda: ("b", "1", "p", "1×", "1", ["x.epyc-avx2"])])
    assert report.main(["--check"]) == 1  # both pages stale
    assert report.main([]) == 0
    assert report.main(["--check"]) == 0
    assert "| b | 1 | p | 1× | 1 | epyc-avx2 | not recorded | not recorded |" in (
        tmp_path / "README.md").read_text()


def test_pick_finds_exactly_one_row():
    report = load_bench("report")
    rows = [{"system": "a", "batch": 1}, {"system": "a", "batch": 8}]
    assert report.pick(rows, system="a", batch=8) is rows[1]
    for match in ({"system": "a"}, {"system": "b"}):
        with pytest.raises(SystemExit, match="rows match"):
            report.pick(rows, **match)


def test_a_result_file_is_shown_by_its_table_or_by_a_link_to_it(tmp_path, monkeypatch):
    report = load_bench("report")
    for stem in ("x.epyc-avx2", "y.xeon-amx"):
        (tmp_path / f"{stem}.json").write_text("{}")
    monkeypatch.setattr(report, "RESULTS", str(tmp_path))
    benchmarks = tmp_path / "benchmarks.md"
    monkeypatch.setattr(report, "BENCHMARKS", str(benchmarks))
    benchmarks.write_text("<!-- table: x.epyc-avx2 -->\n<!-- end generated -->\n")
    assert report.unshown_results() == ["y.xeon-amx"]
    benchmarks.write_text("<!-- table: x.epyc-avx2 -->\n<!-- end generated -->\n"
                          "Also [on AMX](../bench/results/y.xeon-amx.md).\n")
    assert report.unshown_results() == []
