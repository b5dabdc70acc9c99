"""`hearth make-demo-model [--kind chat|vision|audio]`: build (once) an embedded demo model:
the chat model (the default), the vision model or the speech model.

A chat or speech build cut short (Ctrl-C, a kill, a reboot) saved its
training state (`home.demo_resume(kind)`): the chat build at its last
checkpoint, the speech build every 10 steps, both at the step reached on
Ctrl-C or SIGTERM (then exit 130); the next build of the same recipe goes
on from there, and `--force` starts over.

With `--background` (what `hearth serve --build-demo` runs) the build's
state is kept in `home.demo_build(kind)` for the server to show and act on;
the chat model is published at each checkpoint too, and the speech model
skips its held-out evaluation (minutes of 2-core CPU a server does not need).
Its progress goes into the server's log, every 25 steps; what the server
says from the build's state itself (a checkpoint, a resume, a stop) is not
said twice."""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from huggingface_hub import constants

from core import device, home
from core.fs import write_atomically
from serving.demo import vision
from serving.demo.build import DEMO_REPO, Recipe, build
from serving.demo.whisper_build import WHISPER_REPO, WhisperRecipe
from serving.demo.whisper_build import build as build_whisper

log = logging.getLogger("hearth.demo")


class Command(BaseCommand):
    help = (f"Train the small demo chat model and publish it to the local HF cache as {DEMO_REPO}; with --kind "
            f"vision, the demo vision model instead ({vision.VISION_REPO}), with --kind audio, the demo speech "
            f"model ({WHISPER_REPO}: a tiny Whisper for spoken digits).")
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--kind", choices=("chat", "vision", "audio"), default="chat")
        parser.add_argument("--force", action="store_true",
                            help="rebuild even when a cached build exists, and start over rather than "
                                 "resume a build cut short")
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument("--steps", type=int, default=None)
        parser.add_argument("--background", action="store_true",
                            help="built for a server (`hearth serve --build-demo`): keep the build's state in "
                                 "HEARTH_HOME; the chat model is published at each checkpoint, so the server "
                                 "serves it while it trains; the speech model skips its held-out evaluation")

    def handle(self, *args, kind: str, force: bool, seed: int | None, steps: int | None, background: bool,
               **options):
        if background and kind == "vision":
            raise CommandError("--background is for the chat and speech models (`hearth serve --build-demo` "
                               "builds those); build the vision model in the foreground")
        state: dict = {"pid": os.getpid(), "state": "starting", "step": 0, "steps": None, "loss": None,
                       "seconds": 0.0, "served_step": None, "resumed_from": None, "started_at": time.time()}

        def save(**changes) -> None:
            state.update(changes, updated_at=time.time())
            if background:
                write_atomically(home.demo_build(kind), json.dumps(state), durable=False)

        def say(text: str, server_says: bool = False) -> None:
            """A line of the build's progress: on the terminal; built for a server, into its log (the
            lines the server writes itself from the build's state, `server_says`, only once)."""
            if not background:
                self.stdout.write(text)
            elif not server_says:
                log.info("demo %s build: %s", kind, text.strip())

        def progress(step, total, loss, seconds):
            save(state="training", step=step, steps=total, loss=round(loss, 4), seconds=round(seconds, 1))
            if step % 25 and step != total:
                return
            if background:
                say(f"step {step} of {total}, loss {loss:.3f}, {seconds:.0f}s")
            else:
                say(f"  [{'#' * (20 * step // total):<20}] step {step}/{total}  loss {loss:.3f}  {seconds:.0f}s")

        def resumed(step, loss):  # a build cut short before saved its training state at `step`
            save(state="training", step=step, resumed_from=step, loss=None if loss is None else round(loss, 4))
            say(f"  resuming from step {step}, where a build cut short saved its training state "
                f"({home.demo_resume(kind)})", server_says=True)

        def published(step, loss, snapshot):  # a checkpoint before the last: training is under way
            save(state="training", served_step=step)
            how = "untrained" if loss is None else f"loss {loss:.3f}"
            say(f"  checkpoint at step {step} ({how}) published: {snapshot}", server_says=True)

        def stoppable(run):
            """A chat or speech build: stopped (Ctrl-C, or the server stopping it) after saving the step
            reached, it exits 130 (the server logs no failure); failed, its error is kept."""
            try:
                return run()
            except KeyboardInterrupt:
                save(state="stopped")
                say(f"  stopped at step {state['step']} of {state['steps']}; the next build goes on from the "
                    "training state saved last", server_says=True)
                sys.exit(130)
            except BaseException as exc:
                save(state="failed", error=f"{type(exc).__name__}: {exc}")
                raise

        if not background:  # in the background its output is `hearth serve --build-demo`'s, which said it
            self.stdout.write(f"Device: {device.line()}")
        cache = Path(constants.HF_HUB_CACHE)
        if kind == "vision":
            base = vision.VisionRecipe()
            recipe_v = replace(base, seed=base.seed if seed is None else seed,
                               steps=base.steps if steps is None else steps)
            path, built, trained = vision.build(cache, recipe_v, force=force, progress=progress)
            repo = vision.VISION_REPO
            if trained:
                self.stdout.write(f"trained in {trained.get('seconds')}s; held-out accuracy "
                                  f"{trained.get('held_out_accuracy')} on {trained.get('held_out')} pictures")
        elif kind == "audio":
            base_a = WhisperRecipe()
            recipe_a = replace(base_a, seed=base_a.seed if seed is None else seed,
                               steps=base_a.steps if steps is None else steps)
            save(steps=recipe_a.steps)
            path, built, summary = stoppable(lambda: build_whisper(
                cache, recipe_a, force=force, progress=progress, evaluate=not background,
                resume_path=home.demo_resume(kind), resumed=resumed))
            save(state="done", step=recipe_a.steps)
            repo = WHISPER_REPO
            if summary:
                say(f"  trained: {summary}", server_says=True)
        else:
            recipe = replace(Recipe(), seed=Recipe.seed if seed is None else seed,
                             steps=Recipe.steps if steps is None else steps)
            save(steps=recipe.steps)
            path, built = stoppable(lambda: build(cache, recipe, force=force, progress=progress,
                                                  published=published if background else None,
                                                  resume_path=home.demo_resume(kind), resumed=resumed))
            save(state="done", step=recipe.steps, served_step=recipe.steps)
            repo = DEMO_REPO
        verb = "built" if built else "already built"
        if not background:  # the server says what it serves
            self.stdout.write(self.style.SUCCESS(f"{repo} {verb}: {path}"))

