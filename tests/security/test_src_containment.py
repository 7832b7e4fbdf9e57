"""``src`` containment, for every chart: trusted (no keyword) and untrusted alike.

``<data src>``, ``<script src>``, ``<invoke src>`` and, at run time, ``<invoke srcexpr>`` may
read only regular files inside the chart's base directory tree (plus directories a trusted
caller allows). Each test loads a chart that reaches for the secret file beside the base
directory, or for a device, a FIFO, a directory or an oversized file, in every spelling:
absolute, ``..``, ``file:`` URLs, other schemes, symlinks. The audit hook of the sandbox
fails the test on any ``open`` outside the base directory, so "refused" means "never
opened", not "opened and thrown away".
"""

from __future__ import annotations

import os

import pytest

from .helpers import CATCH, scxml

SECRET_PATHS = [
    "../secret.txt",
    "file:../secret.txt",
    "sub/../../secret.txt",
    "{secret}",                       # absolute
    "file:{secret}",
    "file://{secret}",
    "file:///{secret}",
    "FILE:../secret.txt",
    "http://127.0.0.1:9/secret.txt",
    "/proc/self/environ",
    "/dev/zero",
    "/dev/stdin",
    "file:/etc/passwd",
    "//etc/passwd",
    "\\etc\\passwd",
    "C:/secret.txt",
    "",
]


def _fill(src: str, hostile) -> str:
    return src.replace("{secret}", str(hostile.secret))


@pytest.mark.parametrize("trust", [None, "untrusted"])
def test_data_src_outside_the_base_is_refused_at_load(hostile, trust):
    srcs = [_fill(src, hostile) for src in SECRET_PATHS]
    datas = "".join(f'<data id="d{i}" src="{src}"/>' for i, src in enumerate(srcs))
    out = hostile({"main.scxml": scxml(f"<datamodel>{datas}</datamodel><state id='a'/>")}, trust=trust)
    out.assert_refused_at_load()
    assert out.error["type"] == "ChartPolicyError"
    for src in srcs:  # every refusal is listed, each naming its src
        assert f"src {src!r} is refused" in out.error["message"], src


def test_a_chart_without_a_base_directory_may_not_use_src():
    import statebound as sb
    with pytest.raises(sb.ChartPolicyError, match="no base directory"):
        sb.Chart.from_scxml(scxml('<datamodel><data id="x" src="data.json"/></datamodel><state id="a"/>'))


@pytest.mark.parametrize("element", [
    '<script src="{src}"/>',
    '<invoke src="{src}"/>',
])
def test_script_and_invoke_src_outside_the_base_are_refused_at_load(hostile, element):
    body = element.format(src="../secret.txt")
    chart = scxml(f'<state id="a">{body}</state>' if "invoke" in body else f'{body}<state id="a"/>')
    hostile({"main.scxml": chart}, trust=None).assert_refused_at_load("refused")


def test_a_symlink_leaving_the_base_is_refused(hostile):
    def link(base):
        os.symlink(hostile.secret, base / "innocent.json")
        (base / "sub").mkdir()
        os.symlink(hostile.secret.parent, base / "sub" / "up")
    chart = scxml('<datamodel><data id="x" src="innocent.json"/><data id="y" src="sub/up/secret.txt"/>'
                  '</datamodel><state id="a"/>')
    out = hostile({"main.scxml": chart}, trust=None, prepare=link)
    out.assert_refused_at_load("innocent.json", "sub/up/secret.txt", "outside")


def test_a_symlink_inside_the_base_is_followed(hostile):
    def link(base):
        os.symlink(base / "real.json", base / "alias.json")
    chart = scxml('<datamodel><data id="x" src="alias.json"/><data id="y" src="file:sub/../real.json"/>'
                  '</datamodel><state id="a"/>')
    out = hostile({"main.scxml": chart, "real.json": '{"ok": 1}', "sub/keep": ""}, prepare=link)
    out.assert_contained()
    assert out.error is None and out.raw["datamodel"] == {"x": {"ok": 1}, "y": {"ok": 1}}


@pytest.mark.parametrize("what", ["fifo", "directory", "oversized", "not utf-8"])
def test_only_small_regular_text_files_are_read(hostile, what):
    def make(base):
        if what == "fifo":
            os.mkfifo(base / "thing")       # opened for reading it would block the load forever
        elif what == "directory":
            (base / "thing").mkdir()
        elif what == "oversized":
            with open(base / "thing", "wb") as f:
                f.truncate(9 * 1024 * 1024)
        else:
            (base / "thing").write_bytes(b'"\xff\xfe"')
    chart = scxml('<datamodel><data id="x" src="thing"/></datamodel><state id="a"/>')
    hostile({"main.scxml": chart}, prepare=make).assert_refused_at_load("refused")


def test_srcexpr_outside_the_base_is_error_execution_at_run_time(hostile):
    chart = scxml(f"""<datamodel><data id="p" expr="'/dev/' + 'zero'"/></datamodel>
      <state id="a">{CATCH}
        <invoke srcexpr="p"/>
        <invoke srcexpr="'..' + '/secret.txt'"/>
        <invoke srcexpr="'file:///etc/passwd'"/>
        <invoke srcexpr="'sub'"/>
      </state>""")
    out = hostile({"main.scxml": chart, "sub/x": ""})
    out.assert_error_execution("zero", "secret.txt", "//etc/passwd", "not a regular file")
    assert out.raw["configuration"] == ["a"]


def test_srcexpr_inside_the_base_starts_the_child(hostile):
    child = scxml('<final id="done"/>')
    chart = scxml(f"""<state id="a">{CATCH}<invoke srcexpr="'file:' + 'kids/child.scxml'"/>
      <transition event="done.invoke" target="ok"/></state><final id="ok"/>""")
    out = hostile({"main.scxml": chart, "kids/child.scxml": child})
    out.assert_contained()
    assert out.error is None and out.raw["configuration"] == ["ok"], out.raw


def test_from_scxml_reads_inside_its_base_path(hostile):
    chart = scxml('<datamodel><data id="x" src="data.json"/></datamodel><state id="a"/>')
    out = hostile({"main.scxml": chart, "data.json": "[1]"}, load="text")
    out.assert_contained()
    assert out.raw["datamodel"] == {"x": [1]}


def test_allow_dirs_opens_a_directory_to_a_trusted_caller(hostile, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "rates.json").write_text('{"eur": 1}')
    chart = scxml('<datamodel><data id="x" src="../shared/rates.json"/></datamodel><state id="a"/>')
    out = hostile({"main.scxml": chart}, trust=None, allow_dirs=[str(shared)])
    # the sandbox's hook allows opens under the base directory only: the read is refused by
    # the hook, which proves the policy let it through to the open
    assert out.raw["violations"] and "rates.json" in out.raw["violations"][0]
    out = hostile({"main.scxml": chart.replace("../shared/rates.json", "../secret.txt")}, trust=None,
                  allow_dirs=[str(shared)])
    out.assert_refused_at_load("outside the chart's base directory and the allowed directories")


def test_a_src_bomb_is_bounded(hostile):
    # every chart invokes itself by src ten times: 10**8 charts if nothing bounded the load
    kids = "".join('<invoke src="main.scxml"/>' for _ in range(10))
    chart = scxml(f'<state id="a">{kids}</state>')
    out = hostile({"main.scxml": chart})
    out.assert_refused_at_load()
    assert out.error["type"] == "ChartPolicyError" and out.error["length"] < 10_000


def test_a_data_src_bomb_is_bounded(hostile):
    # 64 reads of a 1 MiB file: over the bytes one load may read
    datas = "".join(f'<data id="d{i}" src="big.txt"/>' for i in range(64))
    chart = scxml(f"<datamodel>{datas}</datamodel><state id='a'/>")
    hostile({"main.scxml": chart, "big.txt": "x" * (1 << 20)}).assert_refused_at_load("bytes of src files")
