"""core/torchless.py: Hearth's processes load tokenizers without importing
torch (about 2 s of every start), and xgrammar still gets torch when a
grammar needs it; transformers' scan of its own source is read back from a
cache that a changed source makes it compute again;
HEARTH_TRANSFORMERS_TORCH=1 leaves transformers as it is."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import ROOT

PROBE = """
import json, sys
from core import torchless
torchless.install()
from huggingface_hub import snapshot_download
from mlx_lm import load
_, tok = load(snapshot_download(sys.argv[1], local_files_only=True))
text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
before = "torch" in sys.modules
import xgrammar
from inference.engine.grammar import GrammarCompiler, GrammarSpec
compiler = GrammarCompiler(tok._tokenizer, len(tok.get_vocab()), sorted(tok.eos_token_ids))
compiled = compiler.compile(GrammarSpec("json")) is not None
compiler.close()
import transformers.utils.import_utils as iu
print(json.dumps({"torch_at_load": before, "text": bool(text), "grammar": compiled,
                  "scanned": iu.create_import_structure_from_path.cache_info().misses > 0}))
"""


SCANS = """
import json, sys
from core import torchless
torchless.install()
from huggingface_hub import snapshot_download
from mlx_lm import load
import transformers.utils.import_utils as iu
_, tok = load(snapshot_download(sys.argv[1], local_files_only=True))
print(json.dumps({"scans": iu.create_import_structure_from_path.cache_info().misses,
                  "text": tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)}))
"""


def _probe(tiny_model, code: str = PROBE, **env) -> dict:
    done = subprocess.run([sys.executable, "-c", code, tiny_model], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tokenizers_load_without_torch_and_grammars_still_compile(tiny_model):
    probed = _probe(tiny_model)
    assert {k: probed[k] for k in ("torch_at_load", "text", "grammar")} == {"torch_at_load": False, "text": True,
                                                                            "grammar": True}


def test_the_switch_leaves_transformers_as_it_is(tiny_model):
    switched = _probe(tiny_model, HEARTH_TRANSFORMERS_TORCH="1")
    assert switched["torch_at_load"] is True and switched["scanned"] is True  # the scan cache is off too


def test_the_scan_of_transformers_is_cached_and_a_changed_source_scans_again(tiny_model, tmp_path):
    first = _probe(tiny_model, SCANS, XDG_CACHE_HOME=str(tmp_path))
    [stored] = (tmp_path / "hearth" / "transformers-imports").glob("*.json")
    assert first["scans"] > 100 and json.loads(stored.read_text())["entries"]
    again = _probe(tiny_model, SCANS, XDG_CACHE_HOME=str(tmp_path))
    assert again == {**first, "scans": 0}  # the same tokenizer and template, nothing scanned

    record = json.loads(stored.read_text())
    stored.write_text(json.dumps({**record, "signature": "another transformers"}))
    assert _probe(tiny_model, SCANS, XDG_CACHE_HOME=str(tmp_path)) == first
    assert json.loads(stored.read_text())["signature"] == record["signature"]
