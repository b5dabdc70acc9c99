"""/fit's decode prediction against a measured decode rate of the served
model. Decoding one token reads every weight once, so a model large enough
to be bandwidth-bound (the 103M-parameter float32 llama of bench/decode.py,
about 410 MB) should decode within 3x of bandwidth / weight bytes. The
tiny test models are overhead-bound and are not used for this check.
Both tests time this machine, so they run alone (the `serial` mark), in
`make check-demo`, not in the parallel `make test`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from tests.helpers import ROOT, ServerProcess, server_env

pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def big_server(homes, tmp_path_factory):
    sys.path.insert(0, str(ROOT / "bench"))
    from decode import build_model

    folder = tmp_path_factory.mktemp("big") / "llama-103m"
    build_model(folder)
    # The run's reading was taken as it began; this server probes again, into a file of its own,
    # as it starts, beside the decode it is compared with.
    env = dict(server_env(*homes), HEARTH_MACHINE_FILE=str(folder.parent / "machine.json"))
    proc = ServerProcess(env, str(folder), "--no-worker", "--batch", "1",
                         log_path=tmp_path_factory.mktemp("logs") / "big.log")
    try:
        yield proc.wait_ready(timeout=240)
    finally:
        proc.stop()


def test_predicted_decode_rate_is_within_3x_of_the_measured_one(big_server):
    url = big_server.url
    before = httpx.get(url + "/fit", timeout=120).json()  # may wait for the one-time bandwidth probe
    assert before["measured_decode_tps"] is None
    assert before["report"]["predicted_decode_tps"] > 0 and before["typical_decode_tps"] > 0
    measured = httpx.post(url + "/api/fit/measure", json={"tokens": 24}, timeout=300).json()
    assert measured["ok"] and measured["tokens"] == 24, measured
    predicted = measured["predicted_decode_tps"]  # at the context it measured
    print(f"fit: predicted {predicted} tok/s, measured {measured['decode_tps']} tok/s", before["machine"])
    assert predicted / 3 <= measured["decode_tps"] <= predicted * 3, (predicted, measured)
    after = httpx.get(url + "/fit").json()
    assert after["measured_decode_tps"] == measured["decode_tps"] and after["measured_at"] > 0
    assert httpx.post(url + "/api/fit/measure", json={"tokens": 2}).status_code == 400


def test_the_probe_counts_other_work_on_the_machine():
    """Spinning processes on every core while the probe times: it sees them."""
    from hub import fit

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        gbs, others = fit.measure_decode_bandwidth()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert gbs and gbs > 0
    assert others >= fit.busy_cores(), others


def test_a_busy_reading_is_marked_and_measured_again_at_a_start(tmp_path, monkeypatch):
    """A reading taken while busy is kept but marked; only a server start
    measures again, keeping the higher value; readers see the cached one."""
    from hub import fit

    readings = iter([(2.0, 1.5), (5.0, 0.0), (1.0, 0.0)])  # (GB/s, other cores): busy, quiet, quiet but lower
    monkeypatch.setattr(fit, "measure_decode_bandwidth", lambda: next(readings))
    monkeypatch.setattr(fit, "measure_bandwidth", lambda: 10.0)
    cache = tmp_path / "machine.json"
    assert fit.cached(cache) is None
    first = fit.machine(cache)
    assert first.measured_while_busy and first.decode_bandwidth_gbs == 2.0
    assert json.loads(cache.read_text())["others_cores"] == 1.5
    assert fit.machine(cache) == first and fit.cached(cache) == first  # read back as it is, except at a start
    again = fit.machine(cache, remeasure_busy=True)
    assert not again.measured_while_busy and again.decode_bandwidth_gbs == 5.0
    assert fit.machine(cache, remeasure_busy=True) == again  # quiet now: a start reads it back

    stored = json.loads(cache.read_text())
    stored.update(measured_while_busy=True)
    cache.write_text(json.dumps(stored))
    kept = fit.machine(cache, remeasure_busy=True)  # the new, lower reading does not replace the higher one
    assert kept.decode_bandwidth_gbs == 5.0 and not kept.measured_while_busy
    assert fit.machine(cache).row()["measured_while_busy"] is False
