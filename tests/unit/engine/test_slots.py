"""engine.slots: earlier prompts' KV kept, and put back when a prompt goes back to them."""

from __future__ import annotations

import threading

import torch

from engine.engine import load_engine
from engine.slots import MIN_GAIN, PromptSlots
from engine.types import CompletionRequest, Limits


class FakeLM:
    """tokens plus a per-position 'cache' (the token itself), with LeanLM's snapshot/restore."""

    def __init__(self):
        self.tokens: list[int] = []

    def prefill(self, prompt):
        self.tokens = list(prompt)

    def snapshot(self, n=None):
        n = len(self.tokens) if n is None else min(n, len(self.tokens))
        return list(self.tokens[:n])

    def restore(self, snap):
        self.tokens = list(snap)


def _prompt(file: int, n: int = 200, tail: int = 0) -> list[int]:
    return [file * 1000 + i for i in range(n)] + [7] * tail


def test_a_prompt_that_overwrites_the_cache_keeps_a_copy_and_going_back_restores_it():
    lm, slots = FakeLM(), PromptSlots(capacity=2, max_tokens=300)
    a, b, c = _prompt(1), _prompt(2), _prompt(3)
    assert slots.choose([lm], a) == 0 and not slots.kept  # an empty cache: nothing to keep
    lm.prefill(a)
    assert slots.choose([lm], a + [5]) == 200 and not slots.kept  # typing on: the cache is reused
    lm.prefill(a + [5])
    assert slots.choose([lm], b) == 0 and [k.tokens for k in slots.kept] == [a + [5]]
    lm.prefill(b)
    assert slots.choose([lm], a + [5, 6]) == 201  # back to a: its copy is put back
    assert lm.tokens == a + [5] and slots.restored == 1 and [k.tokens for k in slots.kept] == [b]
    lm.prefill(a + [5, 6])
    slots.choose([lm], c)
    lm.prefill(c)
    slots.choose([lm], _prompt(4))  # a third file: the least recently kept (b) goes
    assert [k.tokens[0] for k in slots.kept] == [1000, 3000]
    slots.clear()
    assert not slots.kept


def test_small_gains_and_near_copies_are_not_kept_twice():
    lm, slots = FakeLM(), PromptSlots(capacity=3, max_tokens=1000)
    a = _prompt(1)
    lm.prefill(a + [9] * 10)
    slots.choose([lm], _prompt(2))
    lm.prefill(a + [8] * 10)  # the same file later: a copy that extends the kept one replaces it
    slots.choose([lm], _prompt(2))
    assert len(slots.kept) == 1 and slots.kept[0].tokens == a + [8] * 10
    lm.prefill(a[: MIN_GAIN // 2] + _prompt(5, 100))
    before = list(lm.tokens)
    assert slots.choose([lm], a[: MIN_GAIN // 2 + 10]) == MIN_GAIN // 2  # the copy would gain < MIN_GAIN
    assert lm.tokens == before
    off = PromptSlots(capacity=0, max_tokens=1000)
    lm.prefill(a)
    off.choose([lm], _prompt(2))
    assert not off.kept


def _long(name: str) -> str:
    body = "".join(f"    {name}_{i} = compute({i}, '{name}')\n" for i in range(12))
    return f"import os\n\n\ndef {name}(path):\n{body}    return "


def test_going_back_to_a_file_is_warm_and_answers_the_same(model_dirs):
    eng = load_engine(str(model_dirs["target"]), str(model_dirs["draft"]), dtype="float32")
    cold = load_engine(str(model_dirs["target"]), str(model_dirs["draft"]), dtype="float32", prompt_slots=0)
    a = CompletionRequest(prefix=_long("alpha"), uri="file:///a.py", path="a.py", limits=Limits(max_tokens=8))
    b = CompletionRequest(prefix=_long("beta"), uri="file:///b.py", path="b.py", limits=Limits(max_tokens=8))
    from engine.router import tensor_bytes

    runs = {}
    before = tensor_bytes(eng)
    for name, e in (("slots", eng), ("cold", cold)):
        first = e.complete(a, threading.Event())
        assert first.stats.prompt_tokens > 2 * MIN_GAIN
        kv = e.target_lm.kv[:, :, :, : first.stats.prompt_tokens].clone()
        e.complete(b, threading.Event())
        back = e.complete(a, threading.Event())
        runs[name] = (first, back)
        if name == "slots":
            assert e.slots.saved >= 1 and e.slots.restored == 1
            kept = sum(c[1].numel() * c[1].element_size() for k in e.slots.kept for c in k.copies)
            assert kept > 0 and tensor_bytes(e) >= before + kept  # the copies count in the engine's memory
            assert back.stats.reused_tokens == back.stats.prompt_tokens - 1  # only the last token runs again
            # the kept positions are the first prefill's, bit for bit (the last one always runs again)
            n = first.stats.prompt_tokens - 1
            assert torch.equal(e.target_lm.kv[:, :, :, :n], kv[:, :, :, :n])
        else:
            assert back.stats.reused_tokens < MIN_GAIN  # without slots: prefilled again
        assert back.tokens == first.tokens
    assert runs["slots"][1].tokens == runs["cold"][1].tokens
    eng.forget()  # what benchmarks do between modes: nothing kept either
    assert not eng.slots.kept
    assert eng.slots.capacity == 3 and cold.slots.capacity == 0  # the CPU's default, and the option


def test_the_server_status_shows_the_slots():
    """draftline/status: prompt_cache.slots for a local engine, nothing for engines without slots."""
    from types import SimpleNamespace

    from lsp_server.server import _slots_status

    slots = PromptSlots(capacity=2, max_tokens=100)
    slots.saved, slots.restored = 3, 1
    assert _slots_status(SimpleNamespace(slots=slots)) == {"slots": {"capacity": 2, "kept": 0, "saved": 3, "restored": 1}}
    assert _slots_status(object()) == {} and _slots_status(None) == {}


def test_going_back_with_every_slot_taken_puts_the_oldest_copy_back():
    """A, B, C, D, then A again with three slots: A's copy is the least recently used one, which
    keeping D's copy must not trim away before it is put back (it raised ValueError)."""
    lm, slots = FakeLM(), PromptSlots(capacity=3, max_tokens=300)
    for f in (1, 2, 3, 4):
        slots.choose([lm], _prompt(f))
        lm.prefill(_prompt(f))
    assert [k.tokens[0] for k in slots.kept] == [1000, 2000, 3000]
    assert slots.choose([lm], _prompt(1) + [5]) == 200 and lm.tokens == _prompt(1)
    assert [k.tokens[0] for k in slots.kept] == [2000, 3000, 4000] and slots.restored == 1


def test_one_slot_swaps_two_files():
    lm, slots = FakeLM(), PromptSlots(capacity=1, max_tokens=300)
    a, b = _prompt(1), _prompt(2)
    slots.choose([lm], a)
    lm.prefill(a)
    for _ in range(3):
        slots.choose([lm], b)
        lm.prefill(b)
        assert slots.choose([lm], a + [5]) == 200 and lm.tokens == a  # b's copy is kept in a's place
        assert [k.tokens for k in slots.kept] == [b]
        assert slots.choose([lm], b + [5]) == 200 and lm.tokens == b
        assert [k.tokens for k in slots.kept] == [a]
        lm.prefill(b)


def test_a_copy_near_the_cache_is_put_back_not_lost():
    """The cache shares 3/4 of the best copy (the same file, edited near its top): keeping the cache's
    copy drops near copies, and the best one must be out of the list before that."""
    lm, slots = FakeLM(), PromptSlots(capacity=3, max_tokens=1000)
    a = _prompt(1, n=400)
    lm.prefill(a)
    slots.choose([lm], _prompt(2, n=400))  # a is kept
    edited = a[:300] + [9] * 100  # the cache now: a with its last quarter changed, sharing 300 of a's 400
    lm.prefill(edited)
    assert slots.choose([lm], a + [5]) == 400 and lm.tokens == a
