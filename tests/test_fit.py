"""/fit's decode prediction against a measured decode rate of the served
model. Decoding one token reads every weight once, so a model large enough
to be bandwidth-bound (the 103M-parameter float32 llama of bench/decode.py,
about 410 MB) should decode within 3x of bandwidth / weight bytes. The
tiny test models are overhead-bound and are not used for this check."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.helpers import ROOT, ServerProcess, server_env


@pytest.fixture(scope="module")
def big_server(homes, tmp_path_factory):
    sys.path.insert(0, str(ROOT / "bench"))
    from decode import build_model

    folder = tmp_path_factory.mktemp("big") / "llama-103m"
    build_model(folder)
    # The session's first server probed the machine while the suite's demo builds ran; probe again
    # as this server starts, beside the decode it is compared with.
    (homes[1] / "machine.json").unlink(missing_ok=True)
    proc = ServerProcess(server_env(*homes), str(folder), "--no-worker", "--batch", "1",
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


def test_a_probe_taken_while_busy_is_marked_and_measured_again(tmp_path):
    """A process spinning on a core during the probe marks the reading busy;
    a server start measures a busy reading again and keeps the higher one."""
    from hub import fit

    cache = tmp_path / "machine.json"
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = fit.machine(cache)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy.measured_while_busy and busy.decode_bandwidth_gbs > 0
    stored = json.loads(cache.read_text())
    assert stored["measured_while_busy"] and stored["busy_cores"] >= fit.BUSY_CORES, stored

    stored["decode_bandwidth_gbs"] = 0.001  # as if the busy probe had read far too low
    cache.write_text(json.dumps(stored))
    assert fit.machine(cache).decode_bandwidth_gbs == 0.001  # read back as it is, except at a start
    again = fit.machine(cache, remeasure_busy=True)
    assert again.decode_bandwidth_gbs > 0.001
    assert json.loads(cache.read_text())["decode_bandwidth_gbs"] == again.decode_bandwidth_gbs

    stored = json.loads(cache.read_text())
    stored.update(decode_bandwidth_gbs=1e6, measured_while_busy=True)  # a higher old reading is kept
    cache.write_text(json.dumps(stored))
    assert fit.machine(cache, remeasure_busy=True).decode_bandwidth_gbs == 1e6
