"""The HTML report (`report|check|watch --html`), its charts and the terminal sparkline.

The browser tests open the pages of real recorded fixtures in headless Chromium (Debian's
`chromium`; skipped only when it is absent): no script error or blocked content, the
findings and charts in the DOM after load, and a screenshot that is not blank.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from synth import SynthProcess, write_run

from mlatrace.analysis.series import SERIES_BUCKETS, Series
from mlatrace.output.charts import Region, regions_of, sparkline

ROOT = Path(__file__).resolve().parents[1]
FROZEN = ROOT / "samples" / "gpu_backends" / "vllm_triton_mla_frozen_one"   # MLT001, H200
FROZEN_TIMED = ROOT / "samples" / "gpu_serve_legacy_timed"   # MLT001 with GPU times
CLEAN = ROOT / "samples" / "gpu_serve_device_timed"   # device policy: no error finding
PAYLOAD = "<script>alert(\"x\")</script>'\"><img src=x onerror=alert(1)>"


def mlatrace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlatrace", *args], capture_output=True,
                          text=True, timeout=300)


# -- the series the charts draw -------------------------------------------------------

def test_series_stays_bounded_and_keeps_every_extreme() -> None:
    s = Series(t0=0)
    for i in range(200_000):
        s.add(i * 1_000_000, 100_000 if i == 123_457 else (1 if i == 7 else 50))
    s.flush()
    assert len(s.count) <= SERIES_BUCKETS
    assert sum(s.count) == s.points == 200_000
    assert max(b[2] for b in s.buckets()) == 100_000  # the one spike survives merging
    assert min(b[1] for b in s.buckets()) == 1
    assert s.downsampled()
    spike = next(b for b in s.buckets() if b[2] == 100_000)
    assert spike[0] <= 123_457 * 1_000_000 < spike[0] + s.bucket_ns


def test_series_of_a_few_points_is_not_downsampled() -> None:
    s = Series(t0=10)
    for i in range(5):
        s.add(10 + i * 10_000_000, i)
    assert [b[1:] for b in s.buckets()] == [(i, i, 1) for i in range(5)]
    assert not s.downsampled()


def test_regions_follow_the_findings() -> None:
    one = {"id": "MLT001", "details": {"threshold": 512, "block_n": 64}}
    (r,) = regions_of([one])
    assert (r.lo, r.hi) == (512, None) and r.holds(100_000) and not r.holds(1)
    valid = {"id": "MLT006", "details": {"input": "seq_len_max", "op": "x", "value": 4,
                                         "valid": {"seq_len_max": [1024, 4095]}}}
    low, high = regions_of([valid])
    assert (low.lo, low.hi, high.lo, high.hi) == (0, 1023, 4096, None)
    far = {"id": "MLT006", "details": {"input": "seq_len_max", "inputs": {"seq_len_max": 64}}}
    assert regions_of([far], far_factor=8)[0].lo == 512
    assert regions_of([{"id": "MLT004", "details": {}}]) == []


def test_sparkline_rises_from_the_captured_length() -> None:
    s = Series(t0=0)
    for i in range(100):
        s.add(i * 1_000_000, 100_000)
    (cap, cells), log = sparkline(s.to_dict(), 1, [Region("MLT001", 512, None, "")], width=10)
    assert log and cap == "▁"
    assert cells.count("[red]█[/]") == 10


# -- the page, made by the commands ---------------------------------------------------

def test_report_html_of_a_frozen_gpu_trace(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    proc = mlatrace("report", str(FROZEN), "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stderr
    assert "replay lengths over time" in proc.stdout and "captured at 1" in proc.stdout
    page = out.read_text()
    assert 'data-id="MLT001"' in page and 'class="verdict v-fail"' in page
    assert page.count('<svg class="chart chart-lengths"') == 1
    assert 'class="frozen-region"' in page and 'class="captured"' in page
    assert "_fwd_grouped_kernel_stage1" in page            # the kernel view, from graph.nodes
    assert "132 (input sm_count" in page or "132 = " in page  # CTAs against the SMs
    assert "mlatrace export" in page and "--perfetto" in page
    # offline: nothing the browser would fetch
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)
    assert "Content-Security-Policy" in page


def test_check_html_keeps_the_verdict(tmp_path: Path) -> None:
    frozen, clean = tmp_path / "ci" / "frozen.html", tmp_path / "clean.html"
    bad = mlatrace("check", str(FROZEN_TIMED), "--html", str(frozen))
    good = mlatrace("check", str(CLEAN), "--html", str(clean))
    assert bad.returncode == 1 and good.returncode == 0, (bad.stderr, good.stderr)
    assert 'data-exit="1"' in frozen.read_text()
    assert 'data-exit="0"' in clean.read_text()
    assert 'class="chart chart-gpu-hist"' in frozen.read_text()  # timed replays
    warned = mlatrace("check", str(CLEAN), "--fail-on", "warning", "--html", str(clean))
    assert warned.returncode == 1 and 'data-exit="1"' in clean.read_text()


def test_html_that_cannot_be_written_is_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = mlatrace("report", str(FROZEN), "--html", str(blocker / "x.html"))
    assert proc.returncode == 2 and "cannot write" in proc.stderr


def test_watch_once_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "live.html"
    proc = mlatrace("watch", str(FROZEN_TIMED), "--once", "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert 'data-id="MLT001"' in page and "chart-lengths" in page


def _hostile_trace(root: Path) -> Path:
    """A trace whose argv, marks, graph key and kernel names carry markup and quotes."""
    write_run(root, argv=["mlatrace", "run", "--", PAYLOAD])
    p = SynthProcess(root, 77, argv=["python", PAYLOAD])
    p.emit("mark", name=PAYLOAD, attrs={PAYLOAD: PAYLOAD})
    p.emit("attn.metadata", backend=PAYLOAD, num_reqs=1, seq_len_min=1, seq_len_max=1,
           capturing=False)
    p.emit("graph.capture.begin", gid=1, parent=None, src="torch", key=PAYLOAD, mode=PAYLOAD)
    p.emit("kernel.split", op=PAYLOAD, num_kv_splits=1, block_n=64, policy="legacy",
           min_kv_seq_len=1, batch=1, qlen=1, nhead=16, capturing=True, gid=1)
    p.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1)
    p.emit("graph.nodes", gid=1, kernels=[{"name": PAYLOAD, "grid": [1, 1, 1],
                                           "block": [128, 1, 1], "smem": 0}])
    for n in range(1, 6):
        p.emit("attn.metadata", backend=PAYLOAD, num_reqs=1, seq_len_min=100_000,
               seq_len_max=100_000 + n, capturing=False)
        p.replay(1)
    p.write()
    return root


def test_markup_from_the_trace_is_text(tmp_path: Path) -> None:
    out = tmp_path / "h.html"
    proc = mlatrace("report", str(_hostile_trace(tmp_path / "t")), "-v", "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert "<script>alert" not in page and "<img" not in page
    assert "onerror=alert" in page  # there, as text
    assert page.count("<script>") == 1  # the page's own
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&#x27;&quot;&gt;" in page


# -- in a real browser ------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# .ci/run sets MLATRACE_REQUIRE_CHROMIUM where it installed chromium: there, never skip
REQUIRED = os.environ.get("MLATRACE_REQUIRE_CHROMIUM") == "1"
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not REQUIRED,
                                    reason="chromium is not installed")


def test_chromium_is_there_where_ci_installed_it() -> None:
    if REQUIRED:
        assert CHROMIUM is not None, "MLATRACE_REQUIRE_CHROMIUM=1 but no chromium on PATH"


def chromium(tmp_path: Path, page: Path, *args: str) -> str:
    profile = tmp_path / f"profile-{page.stem}-{len(args)}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={profile}", *args, page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of pixel bytes) of an 8-bit RGB or RGBA PNG (what Chromium
    writes): chunks, inflate, and the five scanline filters."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r[i:i + 3]) for r in rows for i in range(0, stride, bpp)]


def page_of(tmp_path: Path, trace: Path) -> Path:
    out = tmp_path / f"{trace.name}.html"
    proc = mlatrace("report", str(trace), "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


@needs_chromium
@pytest.mark.parametrize("trace, frozen", [(FROZEN, True), (CLEAN, False)],
                         ids=["frozen", "clean"])
def test_page_in_headless_chromium(tmp_path: Path, trace: Path, frozen: bool) -> None:
    page = page_of(tmp_path, trace)
    dom = chromium(tmp_path, page, "--dump-dom")
    assert 'data-loaded="1"' in dom and 'data-errors="0"' in dom, dom[:600]
    assert len(re.findall(r'<svg class="chart chart-lengths"', dom)) >= 1
    assert ('<path class="bars frozen-bars"' in dom) is frozen
    assert ('data-id="MLT001"' in dom) is frozen
    assert 'id="processes"' in dom and 'id="perfetto"' in dom
    shot = tmp_path / "shot.png"
    chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1200,1600")
    width, height, pixels = png_pixels(shot)
    assert (width, height) == (1200, 1600)
    colours = set(pixels)
    background = max(colours, key=pixels.count) if len(colours) < 50 else None
    assert len(colours) >= 50, f"{len(colours)} colours: a blank page"
    if background is not None:
        assert sum(p != background for p in pixels) > 0.02 * len(pixels)
    if frozen:  # the verdict bar and the frozen bars are red: rgb(197, 48, 48)
        assert sum(1 for p in pixels if p[0] > 180 and p[1] < 80 and p[2] < 80) > 2000


@needs_chromium
def test_browser_sees_blocked_markup_and_hostile_text(tmp_path: Path) -> None:
    out = tmp_path / "h.html"
    assert mlatrace("report", str(_hostile_trace(tmp_path / "t")), "--html",
                    str(out)).returncode == 0
    dom = chromium(tmp_path, out, "--dump-dom")
    assert 'data-loaded="1"' in dom and 'data-errors="0"' in dom
    assert "<img" not in dom and "&lt;script&gt;alert" in dom
    # the check can fail: a script that slipped into the page is blocked and noted
    broken = tmp_path / "broken.html"
    broken.write_text(out.read_text().replace("<main>", "<main><script>alert(1)</script>", 1))
    dom = chromium(tmp_path, broken, "--dump-dom")
    assert 'data-errors="0"' not in dom and "blocked by the page policy" in dom


def test_series_takes_a_folded_span() -> None:
    s = Series(t0=0)
    s.add(0, 5)
    s.add_span(1_000_000, 9_000_000, 100, 200, 1000)
    assert s.points == 1001 and sum(c for *_x, c in s.buckets()) == 1001
    assert (s.lowest, s.highest) == (5, 200)


def test_watch_rewrites_the_page_as_the_run_goes_on(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from mlatrace.output.html_report import LivePage
    from mlatrace.output.watch import LiveRun, follow

    src = next(FROZEN_TIMED.glob("p*.jsonl"))
    lines = src.read_text().splitlines(keepends=True)
    dst = tmp_path / "t"
    dst.mkdir()
    (dst / src.name).write_text("".join(lines[:len(lines) // 3]))
    out = tmp_path / "live.html"
    live, page = LiveRun([dst]), LivePage(str(out))
    console = Console(file=io.StringIO(), width=120)
    follow(live, console, until=lambda: True, page=page)
    first = out.read_text()
    assert 'http-equiv="refresh"' in first  # still running: an open tab reloads
    with (dst / src.name).open("a") as f:
        f.write("".join(lines[len(lines) // 3:]))
    follow(live, console, until=lambda: True, page=page)
    second = out.read_text()
    assert second != first and 'data-id="MLT001"' in second
    page.update(live, final=True)
    assert 'http-equiv="refresh"' not in out.read_text()
