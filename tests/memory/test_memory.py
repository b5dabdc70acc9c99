"""Memory vaults through `/api/memory/*` and the chat tools, in this process
on the session's real SQLite database: init twice, a fixture vault's
search, article metadata, links, history and diffs, path and `rev`
validation, and search finding an article edited by hand."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

RED_FOX = """---
type: Animal
kind: thing
series: Wildlife of the garden
range: Northern hemisphere
---
# Red Fox

The red fox is a small canid that visits the [[Garden]] at night.

## Diet

Foxes eat mice, berries and windfall apples.

## Habitat

Woods, hedges and towns; cousin of the [[Grey Wolf|wolf]].
"""
GREY_WOLF = "# Grey Wolf\n\nA large canid, a distant cousin of the [[Red Fox]].\n"
GARDEN = "# Garden\n\nThe vegetable garden behind the house. Apples grow by the shed.\n"
MANUAL = "# Hedge care\n\nTrim hawthorn hedges after the birds have nested.\n"


@pytest.fixture(scope="module")
def client():
    import django
    from django.core.management import call_command
    from django.test import Client

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    return Client()


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=Owner", "-c", "user.email=o@example.com",
                           *args], check=True, capture_output=True, text=True).stdout


def post(client, path: str, body: dict):
    return client.post(path, json.dumps(body), content_type="application/json")


@pytest.fixture(scope="module")
def vault_root(client, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vaults") / "fixture"
    r = post(client, "/api/memory/init", {"path": str(root), "name": "fixture"})
    assert r.status_code == 200, r.json()
    for name, text in (("Red Fox", RED_FOX), ("Grey Wolf", GREY_WOLF), ("Garden", GARDEN)):
        (root / "articles" / f"{name}.md").write_text(text)
    (root / "Reference" / "Apple varieties.md").write_text("# Apple varieties\n\nBramley apples are for cooking.\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "Fixture articles")
    (root / "articles" / "Garden.md").write_text(GARDEN + "\n## Beds\n\nThree raised beds of leeks.\n")
    git(root, "commit", "-q", "-am", "Garden beds")
    return root


def get(client, path: str, **params):
    r = client.get(path, {"vault": "fixture", **params})
    return r.status_code, r.json()


def test_init_twice_changes_nothing_the_second_time(client, tmp_path):
    root = tmp_path / "twice"
    first = post(client, "/api/memory/init", {"path": str(root), "name": "twice"}).json()
    assert first["ok"] and first["result"]["git_initialized"] and not first["result"]["already_set_up"]
    assert {"README.md", "Meta/Conventions.md"} <= set(first["result"]["created"])
    log, files = git(root, "log", "--format=%H"), sorted(p.as_posix() for p in root.rglob("*") if ".git" not in p.parts)
    second = post(client, "/api/memory/init", {"path": str(root), "name": "twice"}).json()
    assert second["result"] == {"root": str(root.resolve()), "created": [], "git_initialized": False,
                                "already_set_up": True}
    assert git(root, "log", "--format=%H") == log and len(log.split()) == 1
    assert sorted(p.as_posix() for p in root.rglob("*") if ".git" not in p.parts) == files
    assert git(root, "status", "--porcelain") == ""


def test_init_refuses_paths_outside_the_vault_roots(client, tmp_path):
    for bad in ("/etc/hearth-vault", "relative/vault"):
        r = post(client, "/api/memory/init", {"path": bad})
        assert r.status_code == 400 and not r.json()["ok"], bad
    link = tmp_path / "sneaky"
    link.symlink_to("/etc")
    r = post(client, "/api/memory/init", {"path": str(link / "vault")})
    assert r.status_code == 400 and "must be inside" in r.json()["error"]
    assert post(client, "/api/memory/init", {"name": "../x"}).status_code == 400
    assert post(client, "/api/memory/init", {"path": str(tmp_path / "other"), "name": "twice"}).status_code == 409


def test_a_missing_vault_answers_enabled_false(client):
    r = client.get("/api/memory/status", {"vault": "nope"})
    assert r.status_code == 200 and r.json()["enabled"] is False
    assert r.json()["reason"] == "no memory vault named 'nope'"
    for route in ("list", "search", "article", "links", "history", "diff"):
        r = client.get(f"/api/memory/{route}", {"vault": "nope", "q": "x", "name": "x", "rev": "abcd"})
        assert r.status_code == 404 and r.json()["enabled"] is False and "root" in r.json(), route


def test_status_and_list(client, vault_root):
    code, body = get(client, "/api/memory/status")
    assert code == 200 and body["enabled"] and body["status"]["article_count"] == 3
    assert body["status"]["reference_count"] == 1 and body["status"]["is_git_repo"]
    code, body = get(client, "/api/memory/list")
    assert body == {"ok": True, "articles": ["Garden", "Grey Wolf", "Red Fox"],
                    "reference": ["Reference/Apple varieties"]}


def test_search_ranks_sections_and_marks_the_matches(client, vault_root):
    code, body = get(client, "/api/memory/search", q="apples")
    assert code == 200 and body["mode"] == "fts"
    assert {s["article"] for s in body["summaries"]} == {"Red Fox", "Garden", "Reference/Apple varieties"}
    fox = next(h for h in body["hits"] if h["article"] == "Red Fox")
    assert fox["anchor"] == "diet" and fox["line"] == 13
    start, end = fox["ranges"][0]
    assert fox["excerpt"][start:end].lower() == "apples"
    code, body = get(client, "/api/memory/search", q="apples", scope="articles")
    assert "Reference/Apple varieties" not in {s["article"] for s in body["summaries"]}
    code, body = get(client, "/api/memory/search", q="bramley", scope="reference")
    assert [s["article"] for s in body["summaries"]] == ["Reference/Apple varieties"]
    assert get(client, "/api/memory/search", q="canid", limit="1")[1]["hits"].__len__() == 1
    assert get(client, "/api/memory/search", q="canid", limit="100000")[0] == 200  # capped, not refused
    assert get(client, "/api/memory/search")[0] == 400
    assert get(client, "/api/memory/search", q="x", scope="everything")[0] == 400
    assert get(client, "/api/memory/search", q="x", limit="lots")[0] == 400


def test_article_metadata(client, vault_root):
    code, body = get(client, "/api/memory/article", name="red fox")  # names match ignoring case
    assert code == 200 and body["name"] == "Red Fox" and body["path"] == "articles/Red Fox.md"
    assert body["infobox"] == {"type": "Animal", "entity_kind": "thing",
                               "fields": [{"key": "range", "value": "Northern hemisphere"}]}
    assert body["series"] == "Wildlife of the garden"
    assert body["lead"].startswith("The red fox is a small canid")
    assert [(s["title"], s["anchor"], s["line"]) for s in body["structure"]] == [("Diet", "diet", 11),
                                                                                 ("Habitat", "habitat", 15)]
    assert get(client, "/api/memory/article", name="Reference/Apple varieties")[1]["lead"].startswith("Bramley")
    assert get(client, "/api/memory/article", name="Nobody")[0] == 404
    for bad in ("../secret", "a/b", ".hidden", ""):
        assert get(client, "/api/memory/article", name=bad)[0] == 400, bad


def test_links_both_ways(client, vault_root):
    code, body = get(client, "/api/memory/links", name="Red Fox")
    assert body["outbound"] == ["Garden", "Grey Wolf"] and body["inbound"] == ["Grey Wolf"]
    assert get(client, "/api/memory/links", name="Garden")[1]["inbound"] == ["Red Fox"]


def test_history_and_diff(client, vault_root):
    code, body = get(client, "/api/memory/history", name="Garden")
    assert code == 200 and [e["subject"] for e in body["entries"]] == ["Garden beds", "Fixture articles"]
    assert len(get(client, "/api/memory/history", name="Garden", limit="1")[1]["entries"]) == 1
    newest = body["entries"][0]["hash"]
    code, body = get(client, "/api/memory/diff", name="Garden", rev=newest[:7])
    assert code == 200 and "+Three raised beds of leeks." in body["diff"] and body["rev"] == newest
    # A commit that did not touch the article, an unknown commit, and anything that is not a bare hash.
    assert get(client, "/api/memory/diff", name="Red Fox", rev=newest)[0] == 404
    assert get(client, "/api/memory/diff", name="Garden", rev="0000000")[0] == 404
    assert get(client, "/api/memory/diff", name="Nobody", rev=newest)[0] == 404
    for rev in ("HEAD~1", "main", "abc", "ABCDEF12", "--output=/tmp/x", newest + "0"):
        code, body = get(client, "/api/memory/diff", name="Garden", rev=rev)
        assert code == 400 and "commit hash" in body["error"], rev


def test_search_finds_an_article_edited_by_hand(client, vault_root):
    assert get(client, "/api/memory/search", q="hawthorn")[1]["summaries"] == []
    (vault_root / "articles" / "Hedge care.md").write_text(MANUAL)  # outside Hearth, not committed
    body = get(client, "/api/memory/search", q="hawthorn")[1]
    assert [s["article"] for s in body["summaries"]] == ["Hedge care"]
    (vault_root / "articles" / "Hedge care.md").write_text(MANUAL.replace("hawthorn", "blackthorn"))
    assert get(client, "/api/memory/search", q="hawthorn")[1]["summaries"] == []
    assert get(client, "/api/memory/search", q="blackthorn")[1]["summaries"][0]["article"] == "Hedge care"
    (vault_root / "articles" / "Hedge care.md").unlink()
    assert get(client, "/api/memory/search", q="blackthorn")[1]["summaries"] == []


def test_chat_tools_read_the_default_vault_and_cannot_write(client, vault_root):
    from chat.tools import ToolError
    from memory import tools
    from memory.models import MemoryVault

    MemoryVault.objects.update(is_default=False)
    MemoryVault.objects.filter(name="fixture").update(is_default=True)
    assert set(tools.NAMES) == {"memory_search", "memory_list", "memory_read", "memory_links"}
    found = tools.run("memory_search", {"query": "apples"})
    assert "Red Fox#diet line 13" in found and "Garden" in found
    assert "Grey Wolf" in tools.run("memory_list", {})
    diet = tools.run("memory_read", {"name": "Red Fox", "section": "Diet"})
    assert diet.startswith("## Diet") and "Habitat" not in diet
    with pytest.raises(ToolError, match="no section"):
        tools.run("memory_read", {"name": "Red Fox", "section": "Wings"})
    with pytest.raises(ToolError, match="^no article"):
        tools.run("memory_read", {"name": "Nobody"})
    assert "Linked from: Grey Wolf" in tools.run("memory_links", {"name": "Red Fox"})
    with pytest.raises(ToolError, match="^unknown memory tool"):
        tools.run("memory_write", {"name": "x"})
    before = git(vault_root, "status", "--porcelain")
    for name in tools.NAMES:
        try:
            tools.run(name, {"name": "../../etc/passwd", "query": "x"})
        except ToolError:
            pass
    assert git(vault_root, "status", "--porcelain") == before


def test_sessions_round_trip_through_export_and_import(client):
    from chat import store

    session = store.create("Be brief.")
    question = store.add(session, None, "user", "Where do foxes sleep?")
    store.add(session, question, "assistant", "In dens.")
    store.add(session, question, "assistant", "Under hedges.")  # a regenerated sibling
    exported = client.get("/api/sessions/export", {"path": session.id, "format": "jsonl"}).content
    r = client.post("/api/sessions/import", exported, content_type="application/x-ndjson")
    assert r.status_code == 200 and r.json()["message_count"] == 3
    copy = client.get("/api/sessions/export", {"path": r.json()["path"]}).json()["entries"]
    assert copy[0]["systemPrompt"] == "Be brief." and [e["message"]["content"] for e in copy[1:]] == [
        "Where do foxes sleep?", "In dens.", "Under hedges."]
    assert copy[0]["leaf"] == copy[3]["id"] and copy[2]["parentId"] == copy[3]["parentId"] == copy[1]["id"]
    bad = post(client, "/api/sessions/import", {"entries": [{"type": "session"},
                                                            {"type": "message", "id": "a", "parentId": "zz",
                                                             "message": {"role": "user", "content": "hi"}}]})
    assert bad.status_code == 400 and "not an earlier entry" in bad.json()["error"]
    assert post(client, "/api/sessions/import", {"nope": 1}).status_code == 400


def test_hybrid_search_fuses_vectors_when_the_model_embeds(client, vault_root, tiny_model):
    import sqlite3

    from hearth.root import RUNTIME as runtime
    from inference.engine.engine import Engine
    from memory import service

    assert get(client, "/api/memory/search", q="apples", mode="hybrid")[0] == 400  # no embedding model yet
    engine = Engine(tiny_model)
    engine.start()
    runtime.engine, runtime.embeddings_enabled = engine, True
    try:
        assert get(client, "/api/memory/search", q="apples")[1]["mode"] == "fts"  # hybrid is asked for
        code, body = get(client, "/api/memory/search", q="apples", mode="hybrid")
        assert code == 200 and body["mode"] == "hybrid" and body["pending_embeddings"] == 0
        by_name = {s["article"]: s for s in body["summaries"]}
        # Every section is compared by meaning, so articles without the word are ranked too, below the matches.
        assert "Grey Wolf" in by_name and by_name["Grey Wolf"]["occurrences"] == 0
        assert by_name["Red Fox"]["score"] > by_name["Grey Wolf"]["score"]
        assert all("similarity" in s for s in body["summaries"])
        with sqlite3.connect(service.index_path(vault_root)) as db:
            stored = db.execute("SELECT count(*) FROM vectors").fetchone()[0]
        assert stored >= 5
        get(client, "/api/memory/search", q="wolf", mode="hybrid")
        with sqlite3.connect(service.index_path(vault_root)) as db:  # sections are embedded once
            assert db.execute("SELECT count(*) FROM vectors").fetchone()[0] == stored
    finally:
        runtime.engine, runtime.embeddings_enabled = None, False
        engine.close(drain_seconds=0)


def test_every_model_is_in_the_admin_with_working_lists(client, vault_root):
    """Each registered model's list, its search and its first filter answer 200."""
    from django.contrib import admin
    from django.contrib.auth.models import User
    from django.test import Client

    from jobs.models import Job
    from memory.models import MemoryVault, SynthesisRun

    vault = MemoryVault.objects.get(name="fixture")
    # An ended job: a queued one would be picked up by the next server's worker.
    job = Job.objects.create(kind="synthesis", status="done", log_path=str(vault_root.parent / "job.ndjson"))
    SynthesisRun.objects.create(vault=vault, job=job, until=vault.created_at)
    user = User.objects.filter(username="admin-test").first() or User.objects.create_superuser(
        "admin-test", "a@example.com", "pw")
    staff = Client()
    staff.force_login(user)
    apps = {"jobs", "hub", "chat", "memory"}
    registered = [m for m in admin.site._registry if m._meta.app_label in apps]
    assert {MemoryVault, SynthesisRun} <= set(registered)
    for model in registered:
        url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        assert staff.get(url).status_code == 200, url
        assert staff.get(url, {"q": "x"}).status_code == 200, url
    page = staff.get(f"/admin/memory/memoryvault/{vault.id}/change/")
    assert page.status_code == 200 and job.id in page.content.decode()


def test_odd_input_is_refused_not_a_500(client, vault_root, tmp_path):
    assert get(client, "/api/memory/article", name="漢" * 100)[0] == 400  # over the file system's name limit
    assert post(client, "/api/memory/init", {"path": str(tmp_path / "a\x00b")}).status_code == 400
    assert post(client, "/api/memory/init", {"path": 5}).status_code == 400
    assert get(client, "/api/memory/search", q="x", mode="vectors")[0] == 400
    # Another site's page may not start a synthesis with a GET (an <img>, say).
    r = client.get("/v1/memory/synthesize", {"dry": "1"}, headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    r = client.get("/v1/memory/synthesize", {"dry": "1"}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    bad_meta = {"entries": [{"type": "session"}, {"type": "message", "id": "a", "parentId": None, "meta": {
        "toolRounds": [{"text": "", "calls": [{"tool": "x"}]}]}, "message": {"role": "assistant", "content": ""}}]}
    assert post(client, "/api/sessions/import", bad_meta).status_code == 400
    bad_parent = {"entries": [{"type": "session"}, {"type": "message", "id": "a", "parentId": [],
                                                   "message": {"role": "user", "content": "hi"}}]}
    assert post(client, "/api/sessions/import", bad_parent).status_code == 400


def test_symlinks_in_a_vault_are_not_followed(client, vault_root, tmp_path):
    secret = tmp_path / "secret.md"
    secret.write_text("# Secret\n\nthe password is swordfish\n")
    link = vault_root / "articles" / "Secret.md"
    link.symlink_to(secret)
    try:
        assert "Secret" not in get(client, "/api/memory/list")[1]["articles"]
        assert get(client, "/api/memory/article", name="Secret")[0] == 404
        assert get(client, "/api/memory/search", q="swordfish")[1]["summaries"] == []
    finally:
        link.unlink()


def test_search_keeps_sharp_s_and_skips_front_matter(client, vault_root):
    (vault_root / "articles" / "Street.md").write_text("---\nkind: place\n---\n# Street\n\nDie Straße ist lang.\n")
    try:
        assert [s["article"] for s in get(client, "/api/memory/search", q="Straße")[1]["summaries"]] == ["Street"]
        assert "Street" not in [s["article"] for s in get(client, "/api/memory/search", q="place")[1]["summaries"]]
    finally:
        (vault_root / "articles" / "Street.md").unlink()


def test_synthesis_never_writes_outside_its_folder(tmp_path):
    """Whatever names a model proposes, `create` writes only clean names inside articles/."""
    from memory.synthesis import stages

    run = stages.Run(root=tmp_path, model=None, say=lambda message: None)
    fact = {"fact": "x", "session": "s", "title": "t", "date": ""}
    run.new = {"../../escape": {"kind": "thing", "facts": [fact]}, "Good name": {"kind": "place", "facts": [fact]}}
    stages.create(run)
    assert run.created == ["Good name"] and not (tmp_path.parent / "escape.md").exists()
    assert sorted(p.name for p in (tmp_path / "articles").iterdir()) == ["Good name.md"]
    assert stages.clean_name("../../etc/passwd") == "Etc passwd" and stages.clean_name("[[]]") is None


def test_a_capped_run_covers_up_to_its_last_whole_session(client):
    """The next run starts after `covered_until` (or `coveredUntil`, in a summary stored under that name)."""
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from memory.synthesize import _covered

    run = SimpleNamespace(until=datetime(2025, 1, 2, tzinfo=timezone.utc))
    covered = datetime(2025, 1, 1, tzinfo=timezone.utc)
    for key in ("covered_until", "coveredUntil"):
        job = SimpleNamespace(message=json.dumps({"sessions": 2, key: covered.isoformat()}))
        assert _covered(job, run) == covered
    assert _covered(SimpleNamespace(message=json.dumps({"sessions": 2})), run) == run.until


def test_history_and_diff_follow_a_renamed_article(client, vault_root):
    git(vault_root, "mv", "articles/Grey Wolf.md", "articles/Wolf.md")
    git(vault_root, "commit", "-q", "-m", "Rename the wolf")
    try:
        entries = get(client, "/api/memory/history", name="Wolf")[1]["entries"]
        assert [e["subject"] for e in entries] == ["Rename the wolf", "Fixture articles"]
        code, body = get(client, "/api/memory/diff", name="Wolf", rev=entries[1]["hash"])
        assert code == 200 and "+A large canid" in body["diff"] and "Grey Wolf.md" in body["diff"]
    finally:
        git(vault_root, "mv", "articles/Wolf.md", "articles/Grey Wolf.md")
        git(vault_root, "commit", "-q", "-m", "Rename it back")


def test_vaults_do_not_nest(client, vault_root):
    r = post(client, "/api/memory/init", {"path": str(vault_root / "articles" / "inner"), "name": "inner"})
    assert r.status_code == 409 and "nest" in r.json()["error"]
