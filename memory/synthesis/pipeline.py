"""The synthesis job's child: chat sessions in, vault commits out.

    ingest → segment → extract → route → create → section-route → patch → link → wikify

Everything is written in a scratch worktree; each writing stage (create,
patch, link, wikify) that changed something lands in the vault as one
commit, and only after the stage finished. A crash or a cancel therefore
leaves the vault at the last stage that landed, with a clean `git status`.
A dry run reads the sessions and plans the stages, with no model calls and
no writes. No Django here."""
from __future__ import annotations

import json
import time
from pathlib import Path

from jobs.events import EventLog
from jobs.llm import ServedModel
from memory.synthesis import stages
from memory.synthesis.scratch import Scratch

STAGES = ["ingest", "segment", "extract", "route", "create", "section-route", "patch", "link", "wikify"]
WRITES = {"create": "create", "patch": "patch", "link": "link", "wikify": "wikify"}
MAX_SEGMENTS = 400


def run(config: dict, log: EventLog, stage_delay: float = 0.0) -> tuple[str, dict]:
    vault_root = Path(config["vault_root"])
    sessions = json.loads(Path(config["sessions_file"]).read_text(encoding="utf-8"))
    say = lambda message: log.emit("log", message=message)  # noqa: E731
    limit = int(config.get("max_segments") or MAX_SEGMENTS)
    if config.get("dry"):
        return str(vault_root), _dry(vault_root, sessions, limit, log, say)
    model = ServedModel(config.get("api_url"), config.get("model_name"))
    say(f"writing with the model {config.get('model_name') or 'the server serves'}")
    commits: list[dict] = []
    with Scratch(vault_root, Path(config["scratch_root"]), config.get("key", "run"), say) as scratch:
        for stale in Path(config["scratch_root"]).parent.glob("*.index.sqlite3"):  # left by a killed run
            stale.unlink(missing_ok=True)
        state = stages.Run(root=scratch.path, model=model, say=say)
        index_path = Path(config["scratch_root"]).parent / f"{config.get('key', 'run')}.index.sqlite3"
        steps = {
            "ingest": lambda: stages.ingest(state, sessions),
            "segment": lambda: stages.segment(state, limit),
            "extract": lambda: stages.extract(state),
            "route": lambda: stages.route(state, index_path),
            "create": lambda: stages.create(state),
            "section-route": lambda: stages.section_route(state),
            "patch": lambda: stages.patch(state),
            "link": lambda: stages.link(state),
            "wikify": lambda: stages.wikify(state),
        }
        try:
            for number, name in enumerate(STAGES):
                log.emit("stage", stage=name, progress=round(number / len(STAGES), 3), message=f"{name}…")
                if stage_delay:
                    time.sleep(stage_delay)
                result = steps[name]()
                say(f"{name}: {result}")
                if name in WRITES:
                    commit = scratch.land(f"Synthesis {name}: {result}")
                    if commit:
                        commits.append({"stage": name, "hash": commit})
                        log.emit("commit", stage=name, hash=commit, message=result)
                        say(f"{name}: committed {commit[:10]}")
                if name == "ingest" and not state.sessions:
                    say("no chat sessions changed since the last run; nothing to do")
                    break
        finally:
            index_path.unlink(missing_ok=True)
    summary = {"stages": STAGES, "dry": False, "sessions": len(state.sessions),
               "segments": len(state.segments), "facts": len(state.facts), "created": state.created,
               "touched": sorted(state.touched), "commits": commits, "model_calls": state.asked,
               "covered_until": state.covered,
               "note": f"{len(commits)} commit(s) in {vault_root}"}
    return str(vault_root), summary


def _dry(vault_root: Path, sessions: list[dict], limit: int, log: EventLog, say) -> dict:
    state = stages.Run(root=vault_root, model=None, say=say)
    plan = {
        "ingest": lambda: stages.ingest(state, sessions),
        "segment": lambda: stages.segment(state, limit),
        "extract": lambda: f"would ask the model about {len(state.segments)} segment(s)",
        "route": lambda: "would match each entity to an existing article by name, asking the model when "
                         "search finds candidates",
        "create": lambda: "would write one article per new entity",
        "section-route": lambda: "would ask the model which section of an existing article each fact belongs in",
        "patch": lambda: "would add the facts to those sections",
        "link": lambda: "would turn mentions of other articles into wikilinks",
        "wikify": lambda: "would ask the model for a lead and type per new article; refresh Meta/Index.md",
    }
    for number, name in enumerate(STAGES):
        log.emit("stage", stage=name, progress=round(number / len(STAGES), 3), message=f"{name} (dry run)")
        say(f"{name}: {plan[name]()}")
    return {"stages": STAGES, "dry": True, "sessions": len(state.sessions),
            "segments": len(state.segments), "commits": [],
            "note": "dry run: planned only, no model calls and no writes"}
