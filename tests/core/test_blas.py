"""The BLAS `hearth` runs on, with the libraries installed on this machine
(no stand-ins): the first start measures them in child processes and caches
the pick, a later start reads the cache, `--blas` and HEARTH_BLAS override
it, a library that is not a working BLAS is rejected, and /stats and the
Status page show the result. The probe runs with a short timing budget
(_HEARTH_BLAS_PROBE_S) so the measurement takes about a second here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from core import blas
from tests.helpers import ARTIFACTS, HEARTH, ROOT, ServerProcess, server_env

# `make check-slow`, which CI runs after `make test` (docs/contributing/tests.md)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sys.platform != "linux", reason="the BLAS is chosen on Linux only")]
QUICK = "0.01"
SHOW = "import json; from core import blas; print('BLAS=' + json.dumps(blas.current()))"
BAD_SGEMM = """
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc) {
    for (int i = 0; i < m; i++) for (int j = 0; j < n; j++) c[i * ldc + j] = 1.0f;
}
"""


def _env(home: Path, homes, **extra: str) -> dict:
    env = server_env(homes[0], home)
    env.pop("HEARTH_BLAS", None)  # the suite names OpenBLAS (conftest); these tests choose
    env.update(_HEARTH_BLAS_PROBE_S=QUICK, **extra)
    return env


def _start(env: dict, *args: str) -> tuple[dict, str]:
    """A `hearth` command that re-executes with a BLAS: what it ran on, and its stderr."""
    done = subprocess.run([*HEARTH, *args, "django", "shell", "-c", SHOW], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("BLAS="))
    return json.loads(line[5:]), done.stderr


@pytest.fixture(scope="module")
def measured(homes, tiny_model, tmp_path_factory):
    """A real `hearth serve` started in a fresh home, choosing its BLAS by measurement."""
    home = tmp_path_factory.mktemp("blas-home")
    proc = ServerProcess(_env(home, homes), tiny_model, "--no-worker",
                         log_path=tmp_path_factory.mktemp("blas-log") / "serve.log")
    try:
        yield proc.wait_ready(), home
    finally:
        proc.stop()


def test_first_start_measures_every_installed_library_and_caches_the_pick(measured):
    server, home = measured
    record = json.loads((home / "blas.json").read_text())
    names = [c.name for c in blas.installed()]
    assert [r["name"] for r in record["results"]] == names and "reference" in names
    assert all(r["ok"] and r["score"] > 0 and set(r["gflops"]) == {"1", "8", "32"} for r in record["results"])
    best = max(record["results"], key=lambda r: r["score"])
    assert record["best"] == best["name"]
    assert record["key"]["cpu"] == blas.cpu_model() and record["key"]["cores"] == os.cpu_count()
    assert "measuring the BLAS libraries" in server.output()

    everything = httpx.get(server.url + "/stats", timeout=30).json()
    stats = everything["blas"]
    assert stats["name"] == best["name"] and stats["library"] == best["library"] and stats["in_use"] is True
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert {k: everything["device"][k] for k in ("type", "backend", "memory_bytes")} == {
        "type": "cpu", "backend": "cpu", "memory_bytes": ram} and everything["device"]["name"]
    assert f"Device: CPU ({everything['device']['name']}), BLAS: {blas.LABELS[best['name']]}" in server.output()
    assert stats["chosen_by"] == "measurement" and stats["overridden"] is False and stats["measured_at"]
    assert {c["name"]: c["score"] for c in stats["candidates"]} == {r["name"]: r["score"] for r in record["results"]}


def test_a_later_start_reads_the_cache_without_measuring(measured, homes):
    _, home = measured
    before = (home / "blas.json").stat().st_mtime_ns
    ran, err = _start(_env(home, homes))
    assert "measuring" not in err
    assert (home / "blas.json").stat().st_mtime_ns == before
    assert ran["name"] == json.loads((home / "blas.json").read_text())["best"] and ran["chosen_by"] == "measurement"


def test_a_changed_library_set_measures_again(measured, homes, tmp_path):
    _, home = measured
    (tmp_path / "blas.json").write_text((home / "blas.json").read_text())
    record = json.loads((tmp_path / "blas.json").read_text())
    record["key"]["libraries"][0][-1] += 1  # as if a library had been upgraded in place
    (tmp_path / "blas.json").write_text(json.dumps(record))
    _, err = _start(_env(tmp_path, homes))
    assert "measuring the BLAS libraries" in err
    assert json.loads((tmp_path / "blas.json").read_text())["key"] == blas.cache_key(blas.installed())


def test_option_and_env_override_without_measuring(homes, tmp_path):
    env = _env(tmp_path, homes, HEARTH_BLAS="reference")
    ran, err = _start(env)
    assert ran == {"name": "reference", "library": None, "chosen_by": "env"} and "measuring" not in err
    other = blas.installed()[0]  # OpenBLAS where installed
    ran, _ = _start(env, "--blas", other.name)  # the option wins over the environment
    assert ran == {"name": other.name, "library": other.library, "chosen_by": "option"}
    assert not (tmp_path / "blas.json").exists()
    bad = subprocess.run([*HEARTH, "--blas=fastest", "ls"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "--blas must be one of auto, openblas, mkl, blis, reference" in bad.stderr


def test_a_library_that_is_not_a_working_blas_is_rejected(tmp_path, monkeypatch):
    source = tmp_path / "bad.c"
    source.write_text(BAD_SGEMM)
    wrong = tmp_path / "libwrong.so"  # exports cblas_sgemm, computes nonsense
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(wrong), str(source)], check=True)
    not_blas = tmp_path / "libnotblas.so"  # the loader refuses it and runs on without it
    not_blas.write_text("not a shared library")
    monkeypatch.setenv("_HEARTH_BLAS_PROBE_S", QUICK)
    rows = {r["library"]: r for r in (blas.measure(blas.Candidate("mkl", str(p))) for p in (wrong, not_blas))}
    assert "wrong result at M=1" in rows[str(wrong)]["error"] and not rows[str(wrong)]["ok"]
    assert "cblas_sgemm comes from" in rows[str(not_blas)]["error"] and not rows[str(not_blas)]["ok"]

    # Nothing passes: the fallback, and nothing is cached (the next start tries again).
    broken = [blas.Candidate("mkl", str(wrong)), blas.Candidate("blis", str(not_blas))]
    choice = blas.choose("auto", "env", tmp_path / "blas.json", candidates=broken)
    assert choice.chosen_by == "fallback" and choice.candidate.library == blas.find_openblas()
    assert not (tmp_path / "blas.json").exists()

    # Beside a working library the broken ones lose, and the pick is cached.
    choice = blas.choose("auto", "env", tmp_path / "blas.json", candidates=[*broken, blas.Candidate("reference", None)])
    assert choice.candidate.name == "reference" and choice.chosen_by == "measurement" and choice.measured
    assert json.loads((tmp_path / "blas.json").read_text())["best"] == "reference"


def test_the_status_page_shows_the_blas(measured, browser):
    server, _ = measured
    stats = httpx.get(server.url + "/stats", timeout=30).json()["blas"]
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{server.url}/#/status")
    card = page.wait_for_selector("#blas table", timeout=15_000)
    text = page.inner_text("#blas")
    assert stats["label"] in text and "chosen by measurement" in text
    assert all(c["name"] in card.inner_text() for c in stats["candidates"])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "desktop-status-blas.png"), full_page=True)
    page.set_viewport_size({"width": 375, "height": 740})
    page.wait_for_timeout(200)
    assert page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth") <= 1
    page.screenshot(path=str(ARTIFACTS / "phone-status-blas.png"), full_page=True)
    page.close()
