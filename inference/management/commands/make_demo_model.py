"""`hearth make-demo-model`: build (once) the embedded demo chat model."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from django.core.management.base import BaseCommand
from huggingface_hub import constants

from core.blas import blas_in_use
from inference.demo.build import DEMO_REPO, Recipe, build


class Command(BaseCommand):
    help = f"Train the small demo chat model and publish it to the local HF cache as {DEMO_REPO}."

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="rebuild even when a cached build exists")
        parser.add_argument("--seed", type=int, default=Recipe.seed)
        parser.add_argument("--steps", type=int, default=Recipe.steps)

    def handle(self, *args, force: bool, seed: int, steps: int, **options):
        recipe = replace(Recipe(), seed=seed, steps=steps)

        def progress(step, total, loss, seconds):
            bar = "#" * (20 * step // total)
            self.stdout.write(f"  [{bar:<20}] step {step}/{total}  loss {loss:.3f}  {seconds:.0f}s")

        self.stdout.write(f"BLAS: {blas_in_use()}")
        path, built = build(Path(constants.HF_HUB_CACHE), recipe, force=force, progress=progress)
        verb = "built" if built else "already built"
        self.stdout.write(self.style.SUCCESS(f"{DEMO_REPO} {verb}: {path}"))
