"""The two execution lanes. Both run only on the engine thread.

`BatchLane` is continuous batching on mlx-lm's `BatchGenerator`: every row
has its own sampler, logits processors (penalties, bias, grammar), token
limit and prompt cache; new rows join between decode steps, and a long
prompt is prefilled one chunk per step so the other rows keep decoding.

`SerialLane` runs one row at a time on `generate_step`; it serves
`--batch 1`, quantized KV caches (mlx-lm cannot merge them into a batch)
and models whose cache cannot be batched.

`step()` returns (tokens, cache, row) for every row that ended; tokens and
cache are what its KV cache holds, for the prompt cache to keep, or None
when nothing is worth keeping (a row aborted before it decoded).
"""
from __future__ import annotations

import logging

from inference.engine.rows import Row
from inference.engine.sampling import make_processors, make_sampler

log = logging.getLogger("hearth.engine")

Published = list[tuple[list[int], list, "Row"]]


def _special_ids(model) -> list[int]:
    return model.newline_ids + sorted(model.tokenizer.eos_token_ids)


class BatchLane:
    name = "batched"

    def __init__(self, model, size: int, prefill_chunk: int):
        from mlx_lm.generate import BatchGenerator, StopSequences

        self.model = model
        self.capacity = size
        self.gen = BatchGenerator(model.model, completion_batch_size=size, prefill_batch_size=size,
                                  prefill_step_size=prefill_chunk)
        self.eos = StopSequences([[t] for t in sorted(model.tokenizer.eos_token_ids)])
        self.rows: dict[int, Row] = {}
        self.special = _special_ids(model)

    @property
    def active(self) -> int:
        return len(self.rows)

    def all_rows(self) -> list[Row]:
        return list(self.rows.values())

    @property
    def prefilling(self) -> int:
        decoding = set(self.gen._generation_batch.uids)
        return sum(1 for uid in list(self.rows) if uid not in decoding)  # read from other threads too

    def add(self, row: Row, cache: list | None, cached: int) -> None:
        prompt = row.req.prompt_tokens
        (uid,) = self.gen.insert(
            [prompt[cached:]], max_tokens=[row.limit], caches=[cache] if cache is not None else None,
            all_tokens=[list(prompt[:cached])], samplers=[make_sampler(row.req, self.special)],
            logits_processors=[make_processors(row.req)], stop_sequences=[self.eos])
        self.rows[uid] = row

    def step(self) -> Published:
        published: Published = []
        gone = [uid for uid, row in self.rows.items() if row.aborted]
        if gone:
            published += self._remove(gone)
        if not self.rows:
            return published
        _, responses = self.gen.next()
        ended = []
        for r in responses:
            row = self.rows.get(r.uid)
            if row is None:
                continue
            done = row.feed(r.token, r.logprobs)
            if r.finish_reason is not None:  # the generator dropped the row itself
                row.finish = row.finish or r.finish_reason
                del self.rows[r.uid]
                published.append((r.all_tokens, r.prompt_cache, row))
                row.close()
            elif done:
                ended.append(r.uid)
        if ended:
            published += self._remove(ended)
        return published

    def _remove(self, uids: list[int]) -> Published:
        decoding = set(self.gen._generation_batch.uids)
        keep = [u for u in uids if u in decoding]  # mid-prefill caches are not worth keeping
        caches = self.gen.remove(uids, return_prompt_caches=bool(keep))
        out: Published = []
        for uid in uids:
            row = self.rows.pop(uid)
            if uid in keep and uid in caches:
                cache, tokens = caches[uid]
                out.append((list(tokens), cache, row))
            else:
                out.append((None, None, row))
            row.close()
        return out

    def fail_all(self, message: str) -> None:
        uids = list(self.rows)
        if uids:
            self.gen.remove(uids)
        for uid in uids:
            self.rows.pop(uid).fail(message)


class SerialLane:
    name = "serial"
    capacity = 1

    def __init__(self, model, kv_bits: int | None = None, kv_group: int = 64):
        self.model = model
        self.kv_bits = kv_bits
        self.kv_group = kv_group
        self.special = _special_ids(model)
        self.row: Row | None = None
        self._steps = None
        self._cache = None
        self._tokens: list[int] = []

    @property
    def active(self) -> int:
        return 1 if self.row is not None else 0

    prefilling = 0

    def all_rows(self) -> list[Row]:
        row = self.row
        return [row] if row is not None else []

    def add(self, row: Row, cache: list | None, cached: int) -> None:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import make_prompt_cache

        prompt = row.req.prompt_tokens
        processors = make_processors(row.req)
        if cached and processors:  # penalties look back over the whole prompt, cached part included
            prefix = mx.array(prompt[:cached])
            processors = [_with_prefix(p, prefix) for p in processors]
        self._cache = cache if cache is not None else make_prompt_cache(self.model.model)
        self._tokens = list(prompt)
        quant = {}
        if self.kv_bits:
            quant = {"kv_bits": self.kv_bits, "kv_group_size": self.kv_group, "quantized_kv_start": 0}
        self._steps = generate_step(mx.array(prompt[cached:]), self.model.model, max_tokens=row.limit,
                                    sampler=make_sampler(row.req, self.special),
                                    logits_processors=processors or None, prompt_cache=self._cache, **quant)
        self.row = row

    def step(self) -> Published:
        row = self.row
        if row is None:
            return []
        if not row.aborted:
            try:
                token, logprobs = next(self._steps)
            except StopIteration:
                row.finish = row.finish or "length"
            else:
                self._tokens.append(token)
                if not row.feed(token, logprobs):
                    return []
        # Once a token came out, the cache holds the prompt and every token handed out.
        published = [(self._tokens, self._cache, row) if row.count else (None, None, row)]
        self._finish()
        row.close()
        return published

    def _finish(self) -> None:
        self.row, self._steps, self._cache, self._tokens = None, None, None, []

    def fail_all(self, message: str) -> None:
        if self.row is not None:
            row = self.row
            self._finish()
            row.fail(message)


def _with_prefix(processor, prefix):
    import mlx.core as mx

    def run(tokens, logits):
        return processor(mx.concatenate([prefix, tokens]), logits)
    return run
